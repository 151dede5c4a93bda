//! PEFT's LoRA adapters (`tests/fixtures/interop/llama-lora`, `gpt2-lora`: saved by peft with
//! the logits of the adapted model): imported onto their base's run, they give PEFT's logits
//! and greedy continuation; exported again with `--format peft` and imported back, the same
//! model; a LoRA run trained here exports and reads back the same; bad adapters and bases get
//! one line and write nothing. PEFT itself loading the exports runs where Python has it.

use super::*;
use tinygpt_model::LoraTarget;

/// The fixtures: adapter directory, its base's directory.
const ADAPTERS: [(&str, &str); 2] = [("llama-lora", "llama"), ("gpt2-lora", "gpt2")];

/// `tinygpt import --from fixtures/ADAPTER --base BASE --out OUT`.
pub(super) fn import_adapter(
    dir: &Path,
    adapter: &Path,
    base: &str,
    out: &str,
) -> std::process::Output {
    tinygpt(
        dir,
        &[
            "import",
            "--from",
            adapter.to_str().unwrap(),
            "--base",
            base,
            "--out",
            out,
        ],
    )
}

pub(super) fn export_peft(dir: &Path, run: &str, out: &str) -> std::process::Output {
    tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            run,
            "--format",
            "peft",
            "--out",
            out,
        ],
    )
}

#[test]
fn peft_adapters_give_peft_logits_and_export_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (adapter, base) in ADAPTERS {
        import_gpt2(dir, &fixture(base), base);
        let report = ok(import_adapter(dir, &fixture(adapter), base, adapter));
        assert!(report.contains("PEFT LoRA adapter"), "{report}");
        let run = Run::open(&dir.join(adapter)).unwrap();
        let lora = run.config.lora.clone().expect("a LoRA run");
        // Every matrix has an adapter; q and v (gate and up) stacked: rank 4 + 4.
        let all: Vec<LoraTarget> = LoraTarget::all().collect();
        assert_eq!(lora.targets.as_deref(), Some(&all[..]), "{adapter}");
        let rank = if adapter == "llama-lora" { 8 } else { 4 };
        assert_eq!(lora.rank, rank, "{adapter}");
        // PEFT's `lora_dropout` is kept for training on.
        let dropout = if adapter == "llama-lora" { 0.05 } else { 0.0 };
        assert_eq!(lora.dropout, dropout, "{adapter}");
        let want = expected(adapter);
        let base_logits = logits(dir, base, &want.tokens, "flex");
        assert!(
            max_relative(&base_logits, &want.logits) > 1e-2,
            "{adapter}: the adapter should change the base's logits"
        );
        for backend in ["flex", "fused"] {
            let err = max_relative(&logits(dir, adapter, &want.tokens, backend), &want.logits);
            eprintln!("{adapter}, {backend}: max relative error {err:.2e}");
            assert!(err <= 1e-4, "{adapter} on {backend}: {err}");
        }
        assert_eq!(run.tokenizer.encode(&want.text).unwrap(), want.tokens);
        let text = ok(tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                adapter,
                "--prompt",
                &want.text,
                "--temperature",
                "0",
                "--max-new-tokens",
                "8",
                "--backend",
                "flex",
            ],
        ));
        let continuation = run.tokenizer.decode(&greedy(adapter)).unwrap();
        let continuation = continuation.trim_end_matches('\u{FFFD}');
        assert!(
            text.contains(continuation),
            "{adapter}: {text:?} vs {continuation:?}"
        );
        // Out as PEFT and in again: the same model, the same rank (q, k, v share one A).
        let exported = format!("{adapter}-peft");
        ok(export_peft(dir, adapter, &exported));
        check_peft_dir(&dir.join(&exported), &run, adapter == "gpt2-lora");
        let again = format!("{adapter}-again");
        ok(import_adapter(dir, &dir.join(&exported), base, &again));
        let err = max_relative(
            &logits(dir, &again, &want.tokens, "flex"),
            &logits(dir, adapter, &want.tokens, "flex"),
        );
        assert!(err <= 1e-6, "{adapter} exported and imported: {err}");
        let again = Run::open(&dir.join(&again)).unwrap();
        assert_eq!(again.config.lora, Some(lora), "{adapter}");
    }
}

/// An exported adapter directory in PEFT's layout: its config's rank, scale, targets, and one
/// `lora_A [r, in]` and `lora_B [out, r]` per module and block, named as PEFT names them.
fn check_peft_dir(dir: &Path, run: &Run, gpt2: bool) {
    let lora = run.config.lora.as_ref().unwrap();
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], lora.rank);
    assert_eq!(
        config["lora_alpha"].as_f64(),
        Some(lora.scale() * lora.rank as f64)
    );
    assert_eq!(config["fan_in_fan_out"], gpt2);
    assert_eq!(config["lora_dropout"].as_f64(), Some(lora.dropout));
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let m = &run.config.model;
    let (c, r) = (m.n_embd, lora.rank);
    let kv = m.n_kv_head.unwrap_or(m.n_head) * c / m.n_head;
    let modules: Vec<(&str, usize, usize)> = match gpt2 {
        true => vec![
            ("transformer.h.1.attn.c_attn", c, 3 * c),
            ("transformer.h.1.attn.c_proj", c, c),
            ("transformer.h.1.mlp.c_fc", c, 4 * c),
            ("transformer.h.1.mlp.c_proj", 4 * c, c),
        ],
        false => vec![
            ("model.layers.1.self_attn.q_proj", c, c),
            ("model.layers.1.self_attn.k_proj", c, kv),
            ("model.layers.1.self_attn.v_proj", c, kv),
            ("model.layers.1.self_attn.o_proj", c, c),
            ("model.layers.1.mlp.gate_proj", c, 48),
            ("model.layers.1.mlp.up_proj", c, 48),
            ("model.layers.1.mlp.down_proj", 48, c),
        ],
    };
    assert_eq!(file.len(), 2 * 2 * modules.len(), "two blocks, A and B");
    for (module, d_in, d_out) in modules {
        let name = |f: &str| format!("base_model.model.{module}.lora_{f}.weight");
        assert_eq!(
            file.tensor(&name("A")).unwrap().shape(),
            [r, d_in],
            "{module}"
        );
        assert_eq!(
            file.tensor(&name("B")).unwrap().shape(),
            [d_out, r],
            "{module}"
        );
    }
}

/// A LoRA run trained here on an imported Llama: exported as PEFT and imported back, the same
/// logits (its q, k and v share A: the rank stays).
#[test]
fn a_trained_lora_run_exports_to_peft_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_gpt2(dir, &fixture("llama"), "llama");
    ok(train_lora(dir, "llama", "tuned"));
    ok(export_peft(dir, "tuned", "tuned-peft"));
    ok(import_adapter(
        dir,
        &dir.join("tuned-peft"),
        "llama",
        "again",
    ));
    let tokens = [47, 70, 221, 45, 65, 78, 7, 83];
    let err = max_relative(
        &logits(dir, "again", &tokens, "flex"),
        &logits(dir, "tuned", &tokens, "flex"),
    );
    assert!(err <= 1e-6, "{err}");
    let (tuned, again) = (
        Run::open(&dir.join("tuned")).unwrap(),
        Run::open(&dir.join("again")).unwrap(),
    );
    let (a, b) = (
        tuned.config.lora.clone().unwrap(),
        again.config.lora.unwrap(),
    );
    let gpt = tuned.config.gpt(tuned.tokenizer.vocab_size());
    assert_eq!(
        (a.rank, a.scale(), a.targets(&gpt)),
        (b.rank, b.scale(), b.targets(&gpt))
    );
}

/// `train --init-from BASE --lora 4`, a few steps on Paradise Lost.
pub(super) fn train_lora(dir: &Path, base: &str, out: &str) -> std::process::Output {
    train_lora_with(dir, base, out, &[])
}

/// [`train_lora`] with `extra` arguments.
pub(super) fn train_lora_with(
    dir: &Path,
    base: &str,
    out: &str,
    extra: &[&str],
) -> std::process::Output {
    let corpus = corpus();
    let mut args = vec![
        "train",
        "--init-from",
        base,
        "--lora",
        "4",
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        out,
        "--max-iters",
        "4",
        "--set",
        "train.batch_size=2",
        "--set",
        "train.eval_iters=1",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.learning_rate=1e-2",
        "--set",
        "train.sample_tokens=0",
    ];
    args.extend(extra);
    tinygpt(dir, &args)
}

/// A copy of the fixture adapter `name` in `dir`, `edit`ed, in a directory of its own.
fn adapter_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let copy = tempfile::Builder::new()
        .prefix(&format!("{name}-edited-"))
        .tempdir_in(dir)
        .unwrap()
        .keep();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(fixture(name).join(file), copy.join(file)).unwrap();
    }
    edit(&copy);
    copy
}

#[test]
fn adapters_tinygpt_cannot_read_are_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for base in ["llama", "llama-mqa", "gpt2"] {
        import_gpt2(dir, &fixture(base), base);
    }
    let adapter = fixture("llama-lora");
    let set = |key: &'static str, value: serde_json::Value| {
        move |copy: &Path| edit_config_file(&copy.join("adapter_config.json"), key, value)
    };
    let cases: Vec<(PathBuf, &str, &str)> = vec![
        (
            adapter_copy(dir, "llama-lora", set("use_dora", true.into())),
            "llama",
            "DoRA",
        ),
        (
            adapter_copy(
                dir,
                "llama-lora",
                set("modules_to_save", serde_json::json!(["norm"])),
            ),
            "llama",
            "modules_to_save names `norm`",
        ),
        (
            adapter_copy(
                dir,
                "llama-lora",
                set("modules_to_save", serde_json::json!(["lm_head"])),
            ),
            "llama",
            "holds no `lm_head.weight`",
        ),
        (
            adapter_copy(dir, "llama-lora", set("peft_type", "IA3".into())),
            "llama",
            "a IA3 adapter",
        ),
        (
            adapter_copy(dir, "llama-lora", |copy| {
                std::fs::remove_file(copy.join("adapter_model.safetensors")).unwrap()
            }),
            "llama",
            "safe_serialization",
        ),
        // llama-mqa has one key/value head: v_proj's B has rows for two.
        (adapter.clone(), "llama-mqa", "do not fit"),
        // A GPT-2 base has no `model.layers.…` modules.
        (adapter.clone(), "gpt2", "unexpected tensor"),
        (adapter.clone(), "missing-run", "missing-run does not exist"),
    ];
    for (from, base, expected) in cases {
        fails(import_adapter(dir, &from, base, "out"), expected);
        assert!(!dir.join("out").exists(), "{expected}: wrote a run");
    }
    fails(
        tinygpt(
            dir,
            &[
                "import",
                "--from",
                adapter.to_str().unwrap(),
                "--out",
                "out",
            ],
        ),
        "--base",
    );
    fails(
        tinygpt(
            dir,
            &[
                "import",
                "--from",
                fixture("llama").to_str().unwrap(),
                "--base",
                "llama",
                "--out",
                "out",
            ],
        ),
        "--base goes with a PEFT adapter",
    );
    // Exports: a run without adapters; a run whose base has no Hugging Face form.
    fails(export_peft(dir, "llama", "x"), "not a LoRA run");
    assert!(!dir.join("x").exists());
    ok(train(
        dir,
        "modern",
        &[&["--max-iters", "2"], common::MODERN].concat(),
    ));
    ok(tinygpt(
        dir,
        &[
            "train",
            "--init-from",
            "modern",
            "--lora",
            "2",
            "--data",
            corpus().to_str().unwrap(),
            "--out",
            "modern-lora",
            "--max-iters",
            "1",
            "--set",
            "train.eval_iters=1",
            "--set",
            "train.sample_tokens=0",
        ],
    ));
    fails(
        export_peft(dir, "modern-lora", "x"),
        "PEFT adapters attach to a Hugging Face model",
    );
    assert!(!dir.join("x").exists());
}

fn edit_config_file(path: &Path, key: &str, value: serde_json::Value) {
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(path, config.to_string()).unwrap();
}

/// PEFT itself loads an adapter `export --format peft` wrote (a LoRA run trained here on the
/// imported `llama/` fixture) onto that fixture's directory, and computes tinygpt's logits.
/// Needs a Python with torch, transformers and peft, so it is reported as ignored unless asked
/// for (`cargo test --release -- --ignored`); asked for without one, it fails saying why.
#[test]
#[ignore = "needs Python with torch + transformers + peft (TINYGPT_PYTHON): cargo test --release -- --ignored"]
fn peft_loads_exported_adapters_needs_python() {
    let python = peft_python();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_gpt2(dir, &fixture("llama"), "llama");
    ok(train_lora(dir, "llama", "tuned"));
    ok(export_peft(dir, "tuned", "tuned-peft"));
    let tokens = [47u32, 70, 221, 45, 65, 78, 7, 83];
    let theirs = peft_logits(&python, dir, "llama", "tuned-peft", &tokens);
    let err = max_relative(&logits(dir, "tuned", &tokens, "flex"), &theirs);
    eprintln!("PEFT on tinygpt's adapter: max relative error {err:.2e}");
    assert!(err <= 1e-4, "{err}");
}

/// The Python the PEFT checks run (`TINYGPT_PYTHON`, or `python3`), which must have torch,
/// transformers and peft: asked for without them, the check fails saying why.
pub(super) fn peft_python() -> String {
    let python = std::env::var("TINYGPT_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import torch, transformers, peft"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has,
        "needs `{python}` with torch + transformers + peft (set TINYGPT_PYTHON)"
    );
    python
}

/// PEFT's logits for `tokens` from the adapter directory `adapter` (in `dir`) loaded onto the
/// fixture `base`'s Llama directory, in f32.
pub(super) fn peft_logits(
    python: &str,
    dir: &Path,
    base: &str,
    adapter: &str,
    tokens: &[u32],
) -> Vec<Vec<f64>> {
    let script = format!(
        "import json, torch\n\
         from transformers import LlamaForCausalLM\n\
         from peft import PeftModel\n\
         base = LlamaForCausalLM.from_pretrained('{}', dtype=torch.float32)\n\
         m = PeftModel.from_pretrained(base, '{adapter}').eval()\n\
         with torch.no_grad():\n    logits = m(input_ids=torch.tensor([{tokens:?}])).logits[0].tolist()\n\
         print(json.dumps(logits))\n",
        fixture(base).display()
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .current_dir(dir)
        .output()
        .unwrap();
    serde_json::from_str(ok(out).lines().last().unwrap()).unwrap()
}
