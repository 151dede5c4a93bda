//! `tinygpt serve` driven by the client libraries people use, unchanged: the OpenAI Python SDK
//! (completions whole and streamed with penalties, `logit_bias`, `echo` + `logprobs` scoring,
//! chat whole and streamed; chat with a model fine-tuned on conversations) and LangChain
//! (`OpenAI` and `ChatOpenAI`, `invoke` and `stream`).
//! What they return is checked against plain HTTP requests and `tinygpt logits` / `eval`.
//!
//! The Python is `$TINYGPT_CLIENTS_PYTHON` (default `python3`) with the packages of
//! `tests/clients/requirements.txt`, found when the tests are built; without them the test is
//! reported as ignored, except under CI, where it fails.

mod common;

use std::process::Command;

use common::server::Server;
use common::*;
use serde_json::{Value, json};

fn post(server: &Server, path: &str, body: Value) -> Value {
    let (status, value) = server.post_json(path, &body);
    assert_eq!(status, 200, "{path} {body}: {value}");
    value
}

#[test]
#[cfg_attr(
    no_client_python,
    ignore = "no Python with openai and langchain_openai (see TINYGPT_CLIENTS_PYTHON), then rebuild"
)]
fn openai_sdk_and_langchain_work_unchanged() {
    let python = client_python();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(
        dir,
        "run",
        &["--max-iters", "20", "--set", "train.learning_rate=1e-2"],
    ));
    let server = Server::start(
        dir,
        "run",
        &["--backend", "fused", "--max-prompt-tokens", "200"],
    );
    let forced = post(&server, "/v1/tokenize", json!({"content": "z"}))["tokens"][0].clone();
    let script = manifest_dir().join("tests/clients/clients.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}/v1", server.host()))
        .arg(forced.to_string())
        .output()
        .unwrap();
    let report: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("clients.py: {e}\n{}", stderr(&out)));
    let field = |name: &str| report[name].as_str().unwrap().to_owned();

    // The SDK's completions equal a plain request with the same fields, whole and streamed.
    let plain = post(
        &server,
        "/v1/completions",
        json!({"prompt": "Of Man", "max_tokens": 20, "temperature": 0.8, "seed": 7,
               "frequency_penalty": 0.5, "presence_penalty": 0.25}),
    );
    assert_eq!(field("completion"), plain["choices"][0]["text"]);
    assert_eq!(field("completion_streamed"), field("completion"));
    assert_eq!(report["completion_usage"], plain["usage"]);
    assert_eq!(report["completion_streamed_usage"], plain["usage"]);
    assert_eq!(field("forced"), "z".repeat(8));

    // Scoring: each log-probability is the log-softmax of `tinygpt logits`; they add up to
    // `tinygpt eval`'s loss on the same text.
    let text = field("scored_text");
    assert_eq!(text, "Of Man's first");
    let tokens: Vec<String> = serde_json::from_value(report["scored_tokens"].clone()).unwrap();
    assert_eq!(tokens.concat(), text);
    let logprobs: Vec<Option<f64>> =
        serde_json::from_value(report["scored_logprobs"].clone()).unwrap();
    assert_eq!(logprobs[0], None);
    let ids: Vec<u32> = serde_json::from_value(
        post(&server, "/v1/tokenize", json!({"content": text}))["tokens"].clone(),
    )
    .unwrap();
    let rows = log_softmax_rows(dir, &ids);
    for i in 1..ids.len() {
        let want = rows[i - 1][ids[i] as usize];
        let got = logprobs[i].unwrap();
        assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
    }
    let logprobs: Vec<f64> = logprobs.into_iter().flatten().collect();
    assert_scores_match_eval(dir, &text, &logprobs);

    // Chat, whole and streamed, equals a plain chat request.
    let chat = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Of Man"}], "max_tokens": 20, "seed": 5}),
    );
    assert_eq!(field("chat"), chat["choices"][0]["message"]["content"]);
    assert_eq!(field("chat_role"), "assistant");
    assert_eq!(field("chat_streamed"), field("chat"));

    // LangChain (temperature 0: greedy) equals the plain greedy requests.
    let greedy = post(
        &server,
        "/v1/completions",
        json!({"prompt": "Of Man", "max_tokens": 20, "temperature": 0}),
    );
    assert_eq!(field("langchain_invoke"), greedy["choices"][0]["text"]);
    assert_eq!(field("langchain_stream"), field("langchain_invoke"));
    let greedy_chat = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Of Man"}], "max_tokens": 20,
               "temperature": 0}),
    );
    assert_eq!(
        field("langchain_chat_invoke"),
        greedy_chat["choices"][0]["message"]["content"]
    );
    assert_eq!(
        field("langchain_chat_stream"),
        field("langchain_chat_invoke")
    );
    eprintln!("clients.py reported: {report:#}");
}

/// A base model fine-tuned on conversations (`shout_runs`), asked through the OpenAI SDK's chat
/// call: it answers words that are in none of its conversations, and its turn ends there.
#[test]
#[cfg_attr(
    no_client_python,
    ignore = "no Python with openai and langchain_openai (see TINYGPT_CLIENTS_PYTHON), then rebuild"
)]
fn the_sdk_chats_with_a_model_fine_tuned_on_conversations() {
    let python = client_python();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let held_out = shout_runs(dir);
    let server = Server::start(dir, "chat", &["--backend", "fused"]);
    let script = manifest_dir().join("tests/clients/chat.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}/v1", server.host()))
        .args(&held_out)
        .output()
        .unwrap();
    let report: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("chat.py: {e}\n{}", stderr(&out)));
    let answers = report.as_array().unwrap();
    assert_eq!(answers.len(), held_out.len());
    for (word, answer) in held_out.iter().zip(answers) {
        assert_eq!(answer["content"], word.to_uppercase(), "{report}");
        assert_eq!(answer["finish_reason"], "stop", "{report}");
    }
}
