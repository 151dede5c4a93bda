//! Llama-family directories (`LlamaForCausalLM`) saved by transformers: grouped and multi-query
//! heads, untied and tied heads, θ other than 10000, f32 in one file and bf16 in shards. Imported,
//! they give transformers' logits and greedy continuation on Burn and on the fused engine;
//! exported again with `--format hf`, they read back as the same model; bad directories get one
//! line.

use super::*;
use tinygpt_model::parts::{Mlp, Norm, Position};

/// The fixtures: directory, key/value heads, tied head, θ.
const FIXTURES: [(&str, Option<usize>, bool, f64); 2] = [
    ("llama", Some(2), false, 5000.0),
    ("llama-mqa", Some(1), true, 500.0),
];

#[test]
fn llama_directories_give_transformers_logits_and_continuations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (name, kv, tied, theta) in FIXTURES {
        let report = import_gpt2(dir, &fixture(name), name);
        assert!(report.contains("Hugging Face Llama directory"), "{report}");
        let run = Run::open(&dir.join(name)).unwrap();
        let m = &run.config.model;
        assert_eq!(
            (m.position, m.norm, m.mlp),
            (Position::Rope, Norm::Rms, Mlp::SwiGlu)
        );
        assert_eq!(
            (m.n_kv_head, m.tie_embeddings, m.rope_theta),
            (kv, tied, theta)
        );
        assert_eq!(
            (m.n_layer, m.n_head, m.n_embd, m.mlp_width()),
            (2, 4, 32, 48)
        );
        let want = expected(name);
        assert_eq!(run.tokenizer.encode(&want.text).unwrap(), want.tokens);
        for backend in ["flex", "fused"] {
            let err = max_relative(&logits(dir, name, &want.tokens, backend), &want.logits);
            eprintln!("{name}, {backend}: max relative error {err:.2e}");
            assert!(err <= 1e-4, "{name} on {backend}: {err}");
        }
        // The random model's bytes may end inside a character, which the streamed text leaves
        // out until it is complete.
        let continuation = run.tokenizer.decode(&greedy(name)).unwrap();
        let continuation = continuation.trim_end_matches('\u{FFFD}');
        for backend in ["flex", "fused"] {
            let args = [
                "generate",
                "--checkpoint",
                name,
                "--prompt",
                &want.text,
                "--temperature",
                "0",
                "--max-new-tokens",
                "12",
                "--backend",
                backend,
            ];
            let text = ok(tinygpt(dir, &args));
            assert!(
                text.contains(continuation),
                "{name} on {backend}: {text:?} does not continue with {continuation:?}"
            );
        }
    }
}

/// `export --format hf` writes a `LlamaForCausalLM` directory for a model of Llama's parts:
/// imported again it is the same model (its config and its logits), for both fixtures, and a
/// model of both GPT-2's and Llama's lacking parts is refused naming one of each.
#[test]
fn llama_exports_read_back_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (name, ..) in FIXTURES {
        import_gpt2(dir, &fixture(name), name);
        let out = format!("{name}-hf");
        let args = [
            "export",
            "--checkpoint",
            name,
            "--format",
            "hf",
            "--out",
            &out,
        ];
        let report = ok(tinygpt(dir, &args));
        assert!(report.contains("LlamaForCausalLM"), "{report}");
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(&out).join("config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["model_type"], "llama", "{config}");
        let back = format!("{name}-back");
        import_gpt2(dir, &dir.join(&out), &back);
        let (a, b) = (
            Run::open(&dir.join(name)).unwrap(),
            Run::open(&dir.join(&back)).unwrap(),
        );
        assert_eq!(a.config.model, b.config.model);
        assert_eq!(
            a.config.chat, b.config.chat,
            "{name}: the chat template and its stops"
        );
        let tokens = a.tokenizer.encode("Of Man's first").unwrap();
        let err = max_relative(
            &logits(dir, &back, &tokens, "flex"),
            &logits(dir, name, &tokens, "flex"),
        );
        assert!(err <= 1e-6, "{name}: {err}");
    }
    ok(train(
        dir,
        "ln-rope",
        &["--max-iters", "2", "--set", "model.position=\"rope\""],
    ));
    let args = [
        "export",
        "--checkpoint",
        "ln-rope",
        "--format",
        "hf",
        "--out",
        "x",
    ];
    fails(
        tinygpt(dir, &args),
        "cannot express a model with rotary positions (GPT-2's are learned), nor the Llama \
         format one with LayerNorm",
    );
    assert!(!dir.join("x").exists());
}

/// A copy of the `llama` fixture, edited by `edit`.
fn llama_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(fixture("llama")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    edit(&to);
    to
}

/// Settings tinygpt does not compute, and broken directories: one line each (`fails` checks),
/// naming the file and the key or tensor, no run directory left.
#[test]
fn llama_directories_tinygpt_cannot_read_are_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let set = |key: &'static str, value: serde_json::Value| {
        move |d: &Path| {
            let path = d.join("config.json");
            let mut config: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            config[key] = value;
            std::fs::write(path, config.to_string()).unwrap();
        }
    };
    type Edit = Box<dyn FnOnce(&Path)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "scaled",
            Box::new(set(
                "rope_parameters",
                serde_json::json!({"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0}),
            )),
            "rope_parameters (llama3) is not supported",
        ),
        (
            "old-scaled",
            Box::new(set(
                "rope_scaling",
                serde_json::json!({"type": "linear", "factor": 2.0}),
            )),
            "rope_scaling (linear) is not supported",
        ),
        (
            "gelu",
            Box::new(set("hidden_act", "gelu".into())),
            "hidden_act \"gelu\"",
        ),
        (
            "half-bias",
            Box::new(set("attention_bias", true.into())),
            "attention_bias = true and mlp_bias = false",
        ),
        (
            "head-dim",
            Box::new(set("head_dim", 16.into())),
            "head_dim = 16",
        ),
        (
            "no-weights",
            Box::new(|d: &Path| std::fs::remove_file(d.join("model.safetensors")).unwrap()),
            "neither model.safetensors, model.safetensors.index.json nor pytorch_model.bin",
        ),
        (
            "cut",
            Box::new(|d: &Path| {
                let path = d.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(path, &bytes[..bytes.len() - 100]).unwrap();
            }),
            "model.safetensors is not a valid safetensors file",
        ),
        (
            "short-vocab",
            Box::new(set("vocab_size", 200.into())),
            "the tokenizer has 300 tokens but",
        ),
    ];
    for (name, edit, message) in cases {
        let from = llama_copy(dir, name, edit);
        let out = format!("{name}-run");
        let args = ["import", "--from", from.to_str().unwrap(), "--out", &out];
        fails(tinygpt(dir, &args), message);
        assert!(!dir.join(&out).exists(), "{name}");
    }
    // A context longer than the model's positions; a missing shard.
    let from = fixture("llama");
    let args = [
        "import",
        "--from",
        from.to_str().unwrap(),
        "--block-size",
        "65",
        "--out",
        "long",
    ];
    fails(tinygpt(dir, &args), "longer than the model's 64 positions");
    let sharded = dir.join("sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    for entry in std::fs::read_dir(fixture("llama-mqa")).unwrap() {
        let entry = entry.unwrap();
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with("model-00002")
        {
            std::fs::copy(entry.path(), sharded.join(entry.file_name())).unwrap();
        }
    }
    let args = [
        "import",
        "--from",
        sharded.to_str().unwrap(),
        "--out",
        "partial",
    ];
    fails(tinygpt(dir, &args), "model-00002-of-00003.safetensors");
}
