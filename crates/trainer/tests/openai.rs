//! OpenAI's request fields and the routes clients expect, checked against tinygpt's own
//! commands: `logprobs` equal to the log-softmax of `tinygpt logits`, `echo` + `max_tokens: 0`
//! equal to `tinygpt eval`, penalties and `logit_bias` equal to `tinygpt generate`, `n`
//! choices equal to single requests with successive seeds, chat equal to a completion of its
//! template, tokenize and detokenize.

mod common;

use std::path::Path;

use common::server::Server;
use common::*;
use serde_json::{Value, json};

fn trained(dir: &Path) {
    ok(train(
        dir,
        "run",
        &["--max-iters", "20", "--set", "train.learning_rate=1e-2"],
    ));
}

fn post(server: &Server, path: &str, body: Value) -> Value {
    let (status, value) = server.post_json(path, &body);
    assert_eq!(status, 200, "{path} {body}: {value}");
    value
}

fn token_ids(server: &Server, text: &str) -> Vec<u32> {
    let tokens = post(server, "/v1/tokenize", json!({"content": text}));
    serde_json::from_value(tokens["tokens"].clone()).unwrap()
}

/// `logit_bias` of one token.
fn bias(id: u32, value: i32) -> Value {
    let mut map = serde_json::Map::new();
    map.insert(id.to_string(), json!(value));
    Value::Object(map)
}

fn floats(value: &Value) -> Vec<Option<f64>> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(Value::as_f64)
        .collect()
}

/// `echo` with `logprobs`: the prompt and the completion, each token with the log-probability
/// `tinygpt logits` gives it, the alternatives most likely first, offsets in characters; the
/// same streamed. With `max_tokens: 0`, the prompt's total equals `tinygpt eval` on its text.
#[test]
fn logprobs_and_echo_equal_logits_and_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let request = json!({
        "prompt": "Of Man", "max_tokens": 8, "temperature": 0.8, "seed": 3, "logprobs": 2,
        "echo": true,
    });
    let completion = post(&server, "/v1/completions", request.clone());
    let choice = &completion["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(
        text.starts_with("Of Man") && text.chars().count() == 14,
        "{text}"
    );
    let logprobs = &choice["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.concat(), text);
    let offsets: Vec<usize> = serde_json::from_value(logprobs["text_offset"].clone()).unwrap();
    assert_eq!(
        offsets,
        (0..14).collect::<Vec<_>>(),
        "one character a token"
    );
    let got = floats(&logprobs["token_logprobs"]);
    assert_eq!(
        (got.len(), got[0]),
        (14, None),
        "nothing predicts the first token"
    );
    assert!(logprobs["top_logprobs"][0].is_null());
    let ids = token_ids(&server, text);
    let rows = log_softmax_rows(dir, &ids);
    for i in 1..ids.len() {
        let want = rows[i - 1][ids[i] as usize];
        assert!(
            (got[i].unwrap() - want).abs() < 1e-4,
            "token {i}: {got:?} vs {want}"
        );
        let top = logprobs["top_logprobs"][i].as_object().unwrap();
        let best = rows[i - 1]
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        let top_best = top
            .values()
            .filter_map(Value::as_f64)
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(top.len() <= 2 && (top_best - best).abs() < 1e-4, "{top:?}");
    }

    // Streamed: the same tokens and log-probabilities, chunk by chunk.
    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    let (streamed, events) = server.stream(&streaming);
    assert_eq!(streamed, text);
    let streamed_logprobs: Vec<Option<f64>> = events
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap())
        .filter(|c| !c["logprobs"].is_null())
        .flat_map(|c| floats(&c["logprobs"]["token_logprobs"]))
        .collect();
    assert_eq!(streamed_logprobs, got);

    // Scoring only: the prompt's log-probabilities add up to `tinygpt eval`'s total loss.
    let scored_text = "Of Man's first";
    let scored = post(
        &server,
        "/v1/completions",
        json!({"prompt": scored_text, "max_tokens": 0, "echo": true, "logprobs": 0}),
    );
    let choice = &scored["choices"][0];
    assert_eq!(choice["text"], scored_text);
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(scored["usage"]["completion_tokens"], 0);
    let logprobs: Vec<f64> = floats(&choice["logprobs"]["token_logprobs"])
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(logprobs.len(), scored_text.len() - 1);
    assert_scores_match_eval(dir, scored_text, &logprobs);

    // What lm-evaluation-harness's `local-completions` sends: token lists, one new token.
    let scored_ids = token_ids(&server, scored_text);
    let harness = post(
        &server,
        "/v1/completions",
        json!({"model": "x", "prompt": [scored_ids.clone()], "temperature": 0, "max_tokens": 1,
               "logprobs": 1, "seed": 1234, "echo": true}),
    );
    let got = floats(&harness["choices"][0]["logprobs"]["token_logprobs"]);
    assert_eq!(got.len(), scored_ids.len() + 1);
    let context: Vec<f64> = got[1..scored_ids.len()].iter().flatten().copied().collect();
    assert_eq!(context.len(), logprobs.len());
    for (a, b) in context.iter().zip(&logprobs) {
        assert!(
            (a - b).abs() < 1e-6,
            "a batch of one scores the same: {a} vs {b}"
        );
    }
}

/// lm-evaluation-harness's rolling perplexity (`loglikelihood_rolling`, `local-completions` on
/// an `export --format hf`): the harness reads the BOS from `tokenizer_config.json` (else the
/// EOS), finds its id in `tokenizer.json`, and sends each window as token ids after it, with
/// `echo`, `max_tokens: 1`, `logprobs: 1`. Every token of the text gets the log-probability
/// `tinygpt logits` gives it after the end-of-text token.
#[test]
fn lm_eval_harness_rolling_perplexity_request() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let hf = dir.join("hf");
    ok(tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            "run",
            "--format",
            "hf",
            "--out",
            hf.to_str().unwrap(),
        ],
    ));
    let read = |name: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(hf.join(name)).unwrap()).unwrap()
    };
    let config = read("tokenizer_config.json");
    let bos = config["bos_token"].as_str().expect("a BOS is declared");
    assert_eq!((bos, &config["eos_token"]), ("<|endoftext|>", &json!(bos)));
    let added = read("tokenizer.json")["added_tokens"].clone();
    let bos_id = added
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["content"] == bos && t["special"] == true)
        .map(|t| t["id"].as_u64().unwrap() as u32)
        .expect("the BOS is a special token of the exported tokenizer");
    assert_eq!(read("config.json")["bos_token_id"], json!(bos_id));

    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let text = "Of Man's first";
    let ids = token_ids(&server, text);
    assert!(
        !ids.contains(&bos_id),
        "text never gives the end-of-text id"
    );
    let mut window = vec![bos_id];
    window.extend(&ids);
    let harness = post(
        &server,
        "/v1/completions",
        json!({"model": "run", "prompt": [window.clone()], "temperature": 0, "max_tokens": 1,
               "logprobs": 1, "seed": 1234, "echo": true}),
    );
    let got = floats(&harness["choices"][0]["logprobs"]["token_logprobs"]);
    assert_eq!((got.len(), got[0]), (window.len() + 1, None));
    let rows = log_softmax_rows(dir, &window);
    for i in 1..window.len() {
        let want = rows[i - 1][window[i] as usize];
        let got = got[i].expect("each token of the text is scored");
        assert!((got - want).abs() < 1e-4, "token {i}: {got} vs {want}");
    }
}

/// Penalties and `logit_bias` sample what `tinygpt generate` samples with the same flags; a
/// bias of 100 forces a token, -100 bans one; `n` choices are single requests with seeds
/// `seed`, `seed + 1`, …, prompt after prompt.
#[test]
fn penalties_bias_and_n_choices() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let complete = |extra: Value| {
        let mut body = json!({"prompt": "Of", "max_tokens": 30, "temperature": 0, "seed": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        post(&server, "/v1/completions", body)
    };
    let text = |c: &Value, i: usize| c["choices"][i]["text"].as_str().unwrap().to_owned();
    let greedy = text(&complete(json!({})), 0);
    let z = token_ids(&server, "z")[0];
    let forced = text(&complete(json!({"logit_bias": bias(z, 100)})), 0);
    assert_eq!(forced, "z".repeat(30));
    let first = token_ids(&server, &greedy[..1])[0];
    let banned = text(&complete(json!({"logit_bias": bias(first, -100)})), 0);
    assert!(!banned.contains(&greedy[..1]), "{banned}");

    let penalised = complete(json!({
        "frequency_penalty": 1.5, "presence_penalty": 0.5,
        "logit_bias": bias(first, -100),
    }));
    assert_ne!(text(&penalised, 0), banned, "the penalties changed nothing");
    let cli = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "run",
            "--prompt",
            "Of",
            "--max-new-tokens",
            "30",
            "--temperature",
            "0",
            "--seed",
            "1",
            "--frequency-penalty",
            "1.5",
            "--presence-penalty",
            "0.5",
            "--logit-bias",
            &format!("{first}=-100"),
            "--backend",
            "fused",
        ],
    ));
    assert_eq!(cli, format!("Of{}\n", text(&penalised, 0)));

    let sampled = |seed: u64, prompt: &str| {
        let body = json!({"prompt": prompt, "max_tokens": 12, "seed": seed, "temperature": 1.0});
        text(&post(&server, "/v1/completions", body), 0)
    };
    let many = post(
        &server,
        "/v1/completions",
        json!({"prompt": ["Of", "The"], "n": 2, "best_of": 2, "max_tokens": 12, "seed": 40,
               "temperature": 1.0}),
    );
    let choices = many["choices"].as_array().unwrap();
    let indices: Vec<u64> = choices
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    let want = [
        sampled(40, "Of"),
        sampled(41, "Of"),
        sampled(40, "The"),
        sampled(41, "The"),
    ];
    let got: Vec<String> = (0..4).map(|i| text(&many, i)).collect();
    assert_eq!(got, want);
    assert_ne!(got[0], got[1], "two seeds, one text");
    assert_eq!(
        many["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 48, "total_tokens": 53})
    );
    let mut streaming = json!({"prompt": "Of", "n": 2, "max_tokens": 12, "seed": 40,
                               "temperature": 1.0, "stream": true});
    let (_, events) = server.stream(&streaming);
    for (index, want) in want[..2].iter().enumerate() {
        let joined: String = events
            .iter()
            .flat_map(|e| e["choices"].as_array().unwrap())
            .filter(|c| c["index"] == index)
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        assert_eq!(&joined, want);
    }
    streaming["n"] = json!(1);
    assert_eq!(server.stream(&streaming).0, want[0]);
}

/// Chat: the messages written through the template and continued as a completion with the
/// template's stop; whole, streamed (role first, then content, then the finish), and with a
/// template from a file.
#[test]
fn chat_is_a_completion_of_its_template() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(
        dir,
        "run",
        &["--backend", "fused", "--max-prompt-tokens", "200"],
    );
    let messages = json!([
        {"role": "system", "content": "Sing"},
        {"role": "user", "content": [{"type": "text", "text": "Of Man"}]},
    ]);
    let request = json!({"messages": messages, "max_tokens": 40, "seed": 5, "temperature": 0.9});
    let chat = post(&server, "/v1/chat/completions", request.clone());
    assert_eq!(chat["object"], "chat.completion");
    let choice = &chat["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    let reply = choice["message"]["content"].as_str().unwrap();
    // tinygpt's own format, its markers special tokens read out of the prompt's text.
    let prompt = "<|endoftext|><|system|>Sing<|end|><|user|>Of Man<|end|><|assistant|>";
    let completion = post(
        &server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 40, "seed": 5, "temperature": 0.9,
               "stop": ["<|end|>", "<|endoftext|>"]}),
    );
    assert_eq!(reply, completion["choices"][0]["text"]);
    assert_eq!(
        choice["finish_reason"],
        completion["choices"][0]["finish_reason"]
    );
    assert_eq!(chat["usage"], completion["usage"]);

    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    streaming["stream_options"] = json!({"include_usage": true});
    streaming["logprobs"] = json!(true);
    let (streamed, events) = server.stream_at("/v1/chat/completions", &streaming);
    assert_eq!(streamed, reply);
    assert!(
        events
            .iter()
            .all(|e| e["object"] == "chat.completion.chunk")
    );
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let finish = &events[events.len() - 2]["choices"][0];
    assert_eq!(
        (&finish["delta"], &finish["finish_reason"]),
        (&json!({}), &choice["finish_reason"])
    );
    assert_eq!(events.last().unwrap()["usage"], chat["usage"]);
    let tokens: String = events
        .iter()
        .flat_map(|e| e["choices"].as_array().unwrap())
        .filter(|c| !c["logprobs"].is_null())
        .flat_map(|c| c["logprobs"]["content"].as_array().unwrap().clone())
        .map(|t| t["token"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tokens, reply);
    drop(server);

    std::fs::write(
        dir.join("plain.toml"),
        "message = \"{content}\\n\"\nassistant = \"\"\n",
    )
    .unwrap();
    let server = Server::start(
        dir,
        "run",
        &["--backend", "fused", "--chat-template", "plain.toml"],
    );
    let plain = post(
        &server,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Of Man"}], "max_tokens": 20, "seed": 5}),
    );
    let completion = post(
        &server,
        "/v1/completions",
        json!({"prompt": "Of Man\n", "max_tokens": 20, "seed": 5, "stop": ["\nuser:"]}),
    );
    assert_eq!(
        plain["choices"][0]["message"]["content"],
        completion["choices"][0]["text"]
    );
    drop(server);
    fails(
        tinygpt(
            dir,
            &[
                "serve",
                "--checkpoint",
                "run",
                "--chat-template",
                "missing.toml",
            ],
        ),
        "--chat-template missing.toml",
    );
}

/// Tokenize and detokenize round-trip (also at llama.cpp's paths), and `/v1/models` says what
/// a client needs to count tokens.
#[test]
fn tokenize_detokenize_and_model_metadata() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir);
    let server = Server::start(dir, "run", &["--backend", "fused"]);
    let ids = token_ids(&server, "Of Man");
    assert_eq!(ids.len(), 6, "a character a token");
    let back = post(&server, "/v1/detokenize", json!({"tokens": ids}));
    assert_eq!(back["content"], "Of Man");
    let pieces = post(
        &server,
        "/tokenize",
        json!({"content": "Of", "with_pieces": true}),
    );
    assert_eq!(
        pieces["tokens"],
        json!([{"id": ids[0], "piece": "O"}, {"id": ids[1], "piece": "f"}])
    );
    assert_eq!(
        post(&server, "/detokenize", json!({"tokens": [ids[0]]}))["content"],
        "O"
    );
    let (_, _, models) = server.get("/v1/models", None);
    let meta = &serde_json::from_str::<Value>(&models).unwrap()["data"][0]["meta"];
    let health = server.health();
    assert_eq!(meta["vocab_size"], health["vocab_size"]);
    assert_eq!(meta["tokenizer"], "char");
    assert_eq!(
        (&meta["n_ctx_train"], &meta["max_prompt_tokens"]),
        (&json!(16), &json!(16))
    );
}

/// Supervised fine-tuning on conversations: a base model fine-tuned on a JSONL file of
/// "shout WORD" → "WORD" in capitals (only the replies taught) answers words it never saw through
/// the chat API, and ends its turn there ("stop"); the base model does not.
#[test]
fn fine_tuning_on_conversations_teaches_the_replies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let held_out = shout_runs(dir);
    let answers = |run: &str| -> Vec<(String, String)> {
        let server = Server::start(dir, run, &["--backend", "fused"]);
        held_out
            .iter()
            .map(|w| {
                let request = json!({"messages": [{"role": "user", "content": format!("shout {w}")}],
                                     "max_tokens": 20, "temperature": 0});
                let reply = post(&server, "/v1/chat/completions", request);
                let choice = &reply["choices"][0];
                (
                    choice["message"]["content"].as_str().unwrap().to_owned(),
                    choice["finish_reason"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let tuned = answers("chat");
    for (word, (content, finish)) in held_out.iter().zip(&tuned) {
        assert_eq!(
            (content.as_str(), finish.as_str()),
            (word.to_uppercase().as_str(), "stop")
        );
    }
    let base = answers("base");
    assert!(
        held_out
            .iter()
            .zip(&base)
            .all(|(w, (content, _))| *content != w.to_uppercase()),
        "{base:?}"
    );

    // `eval --data` on conversations scores the replies of held-out ones, as validation does.
    let lines: Vec<String> = held_out
        .iter()
        .map(|w| {
            json!({"messages": [{"role": "user", "content": format!("shout {w}")},
                                {"role": "assistant", "content": w.to_uppercase()}]})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("held.jsonl"), lines.join("\n")).unwrap();
    let loss = |run: &str| -> f64 {
        let args = [
            "eval",
            "--checkpoint",
            run,
            "--data",
            "held.jsonl",
            "--backend",
            "fused",
        ];
        let out = ok(tinygpt(dir, &args));
        assert!(out.contains("5 conversations of held.jsonl"), "{out}");
        eval_loss(&out)
    };
    let (tuned, base) = (loss("chat"), loss("base"));
    assert!(tuned < 0.1 && base > 2.0, "fine-tuned {tuned}, base {base}");
}
