//! Imported chat templates: rendered as transformers' `apply_chat_template` renders them
//! (`chat.json`, written by `make_fixtures.py`: ChatML from `chat_template.jinja`, a Llama-2
//! layout from `tokenizer_config.json`), served by `/v1/chat/completions` and written by
//! `generate --chat`, which stop at the model's end-of-turn ids, and kept by fine-tuning and
//! export.

use serde_json::{Value, json};
use tinygpt::chat::{ChatTemplate, Message};

use super::*;
use crate::common::server::Server;

/// A fixture's `chat.json`: conversations with transformers' text and ids, or its refusal.
fn cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(name).join("chat.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn messages(case: &Value) -> Vec<Message> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| Message {
            role: m["role"].as_str().unwrap().into(),
            content: m["content"].as_str().unwrap().into(),
        })
        .collect()
}

#[test]
fn imported_chat_templates_render_as_transformers_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (name, stops) in [
        ("llama", vec!["<|im_end|>"]),
        ("llama-mqa", vec!["<|im_end|>", "<|endoftext|>"]),
    ] {
        let report = import_gpt2(dir, &fixture(name), name);
        assert!(report.contains("chat template kept"), "{report}");
        let run = Run::open(&dir.join(name)).unwrap();
        assert_eq!(
            run.config.chat.stop, stops,
            "{name}: generation_config's ids"
        );
        assert_eq!(
            (&*run.config.chat.bos_token, &*run.config.chat.eos_token),
            ("<|im_start|>", "<|im_end|>")
        );
        let template = ChatTemplate::new(None, &run.config.chat).unwrap();
        for case in cases(name) {
            let rendered = template.render(&messages(&case));
            match case["text"].as_str() {
                Some(text) => {
                    let rendered = rendered.unwrap();
                    assert_eq!(rendered, text, "{name}");
                    let ids: Vec<u32> = serde_json::from_value(case["tokens"].clone()).unwrap();
                    let with_specials = run.tokenizer.encode_with_specials(&rendered);
                    assert_eq!(with_specials.unwrap(), ids, "{name}");
                    // As plain text, the markers it spells are text, never their ids.
                    let plain = run.tokenizer.encode(&rendered).unwrap();
                    let special = |id: &u32| run.tokenizer.specials().iter().any(|s| s.id == *id);
                    assert!(!plain.iter().any(special), "{name}: {plain:?}");
                    assert_eq!(run.tokenizer.decode(&plain).unwrap(), rendered);
                }
                None => assert_eq!(
                    rendered.unwrap_err().to_string(),
                    case["error"].as_str().unwrap()
                ),
            }
        }
    }
}

/// `/v1/chat/completions` over an imported model: the prompt is the template's (as many tokens
/// as transformers gives), the reply is what `/v1/completions` continues that text with, and it
/// ends at the end-of-turn token; a refused conversation is a 400 with the template's words;
/// `--chat-template` overrides the run's.
#[test]
fn serve_speaks_the_imported_template_and_stops_at_the_end_of_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The Llama-2 layout's first conversation: ChatML's overflow the fixture's 64 positions.
    import_gpt2(dir, &fixture("llama-mqa"), "mqa");
    let case = &cases("llama-mqa")[0];
    let ids = case["tokens"].as_array().unwrap().len();
    let server = Server::start(dir, "mqa", &["--backend", "fused"]);
    let greedy = json!({"messages": case["messages"], "max_tokens": 6, "temperature": 0});
    let (status, chat) = server.post_json("/v1/chat/completions", &greedy);
    assert_eq!(status, 200, "{chat}");
    assert_eq!(chat["usage"]["prompt_tokens"], ids);
    let plain = json!({"prompt": case["text"], "max_tokens": 6, "temperature": 0,
                       "stop": ["<|im_end|>", "<|endoftext|>"]});
    let (_, completion) = server.post_json("/v1/completions", &plain);
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        completion["choices"][0]["text"]
    );
    // `generate --chat` writes the same conversation and prints the same reply.
    let user = case["messages"][0]["content"].as_str().unwrap();
    let args = [
        "generate",
        "--checkpoint",
        "mqa",
        "--chat",
        "--prompt",
        user,
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
        "--backend",
        "fused",
    ];
    let printed = ok(tinygpt(dir, &args));
    assert_eq!(
        printed.strip_suffix('\n').unwrap(),
        chat["choices"][0]["message"]["content"].as_str().unwrap()
    );
    // Each end-of-turn id made the most likely token: the reply ends at once, without it.
    for id in ["2", "0"] {
        let mut forced = greedy.clone();
        forced["logit_bias"] = json!({ id: 100 });
        let (_, ended) = server.post_json("/v1/chat/completions", &forced);
        assert_eq!(ended["choices"][0]["finish_reason"], "stop", "{ended}");
        assert_eq!(ended["choices"][0]["message"]["content"], "");
    }
    let refused = &cases("llama-mqa")[2];
    let (status, body) = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": refused["messages"], "max_tokens": 2}),
    );
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("must alternate"), "{message}");
    drop(server);

    import_gpt2(dir, &fixture("llama"), "llama");
    std::fs::write(dir.join("plain.jinja"), "{{ messages[-1].content }}").unwrap();
    let server = Server::start(
        dir,
        "llama",
        &["--backend", "fused", "--chat-template", "plain.jinja"],
    );
    let (_, chat) = server.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Of Man's first"}], "max_tokens": 1}),
    );
    let run = Run::open(&dir.join("llama")).unwrap();
    let own = run.tokenizer.encode("Of Man's first").unwrap().len();
    assert_eq!(chat["usage"]["prompt_tokens"], own, "{chat}");
}

/// A run fine-tuned from an imported chat model keeps its template; a `[chat]` of the run's own
/// config replaces it; `--resume --set chat.…` may change it; a template that does not compile
/// is one line.
#[test]
fn fine_tuning_keeps_the_chat_template_and_configs_may_set_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_gpt2(dir, &fixture("llama"), "llama");
    let source = Run::open(&dir.join("llama")).unwrap();
    std::fs::write(
        dir.join("text.txt"),
        "Of Man's first disobedience\n".repeat(40),
    )
    .unwrap();
    let tune = |out: &str, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--init-from",
            "llama",
            "--data",
            "text.txt",
            "--out",
            out,
            "--max-iters",
            "1",
            "--backend",
            "fused",
            "--set",
            "model.block_size=16",
            "--set",
            "train.batch_size=2",
            "--set",
            "train.eval_iters=1",
        ];
        args.extend_from_slice(extra);
        tinygpt(dir, &args)
    };
    ok(tune("tuned", &[]));
    assert_eq!(
        Run::open(&dir.join("tuned")).unwrap().config.chat,
        source.config.chat
    );
    ok(tune(
        "own",
        &["--set", "chat.template=\"{{ messages[0].content }}\""],
    ));
    let own = Run::open(&dir.join("own")).unwrap();
    assert_eq!(own.config.chat.template, "{{ messages[0].content }}");
    let resume = [
        "train",
        "--resume",
        "--out",
        "own",
        "--set",
        "chat.stop=[\"<|endoftext|>\"]",
    ];
    ok(tinygpt(dir, &resume));
    let own = Run::open(&dir.join("own")).unwrap();
    assert_eq!(own.config.chat.stop, ["<|endoftext|>"]);
    fails(
        tune("bad", &["--set", "chat.template=\"{% if %}\""]),
        "chat.template: the chat template does not compile",
    );
    assert!(!dir.join("bad").exists());
    // Conversations: a line that is not one is named, and nothing is written.
    let good = r#"{"messages": [{"role": "user", "content": "Of Man"}, {"role": "assistant", "content": "first"}]}"#;
    std::fs::write(
        dir.join("chat.jsonl"),
        format!("{good}\n{{\"prompt\": 1}}\n"),
    )
    .unwrap();
    let args = [
        "train",
        "--init-from",
        "llama",
        "--data",
        "chat.jsonl",
        "--out",
        "bad2",
    ];
    fails(
        tinygpt(dir, &args),
        "chat.jsonl: line 2: not a conversation",
    );
    assert!(!dir.join("bad2").exists());
}

/// The imported chat models exported again with `--format hf`: transformers renders each
/// conversation from the export's files as it did from the fixture's, and its generation
/// config ends at the same ids. Called by the test that needs Python (`main.rs`).
pub fn transformers_reads_exported_chat_templates(dir: &Path, python: &str) {
    for (name, ids) in [("llama", "2"), ("llama-mqa", "[2, 0]")] {
        let run = format!("{name}-chat");
        import_gpt2(dir, &fixture(name), &run);
        let hf = format!("{run}-hf");
        let export = [
            "export",
            "--checkpoint",
            &run,
            "--format",
            "hf",
            "--out",
            &hf,
        ];
        ok(tinygpt(dir, &export));
        let script = format!(
            "import json\n\
             from transformers import AutoTokenizer, GenerationConfig\n\
             t = AutoTokenizer.from_pretrained('{hf}')\n\
             cases = json.load(open('{chat}'))\n\
             texts = [t.apply_chat_template(c['messages'], add_generation_prompt=True, \
             tokenize=False) for c in cases if 'text' in c]\n\
             eos = GenerationConfig.from_pretrained('{hf}').eos_token_id\n\
             print(json.dumps({{'texts': texts, 'eos': eos}}))\n",
            chat = fixture(name).join("chat.json").display()
        );
        let out = Command::new(python)
            .args(["-c", &script])
            .current_dir(dir)
            .output()
            .unwrap();
        let theirs: Value = serde_json::from_str(ok(out).lines().last().unwrap()).unwrap();
        let want: Vec<Value> = cases(name)
            .into_iter()
            .filter_map(|c| c.get("text").cloned())
            .collect();
        assert_eq!(
            theirs["texts"],
            json!(want),
            "{name}: rendered from the export"
        );
        assert_eq!(theirs["eos"].to_string().replace(',', ", "), ids, "{name}");
    }
}
