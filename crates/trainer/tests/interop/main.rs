//! Models from elsewhere: nanoGPT's `ckpt.pt` + `meta.pkl`, a Hugging Face GPT-2 directory and
//! Llama-family directories (`llama.rs`), saved by the real libraries (`tests/fixtures/interop`,
//! see its README), imported and compared with the logits PyTorch computed; `export --format hf`
//! read back; fine-tuning with `--init-from`; bad inputs. The live round trip through
//! transformers runs where Python has it.

mod chat;
#[path = "../common/mod.rs"]
mod common;
mod llama;
mod peft;
mod peft_saved;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{LLAMA, corpus, fails, logits, manifest_dir, ok, tinygpt, train, weights};
use tinygpt::run::checkpoint::Run;

fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/interop").join(name)
}

/// A fixture's text, token ids and logits `[tokens][vocab]`.
struct Expected {
    text: String,
    tokens: Vec<u32>,
    logits: Vec<Vec<f64>>,
}

fn expected(dir: &str) -> Expected {
    let text = std::fs::read_to_string(fixture(dir).join("logits.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    Expected {
        text: value["text"].as_str().unwrap().to_string(),
        tokens: serde_json::from_value(value["tokens"].clone()).unwrap(),
        logits: serde_json::from_value(value["logits"].clone()).unwrap(),
    }
}

/// The greedy continuation the library saved beside a fixture's logits.
fn greedy(dir: &str) -> Vec<u32> {
    let text = std::fs::read_to_string(fixture(dir).join("logits.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(value["greedy"].clone()).unwrap()
}

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude.
fn max_relative(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len(), "rows");
    let scale = b.iter().flatten().fold(0f64, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "columns");
            x.iter().zip(y).map(|(x, y)| (x - y).abs() / scale)
        })
        .fold(0f64, f64::max)
}

fn import_nanogpt(dir: &Path, out: &str) -> String {
    let ckpt = fixture("nanogpt/ckpt.pt");
    let meta = fixture("nanogpt/meta.pkl");
    ok(tinygpt(
        dir,
        &[
            "import",
            "--from",
            ckpt.to_str().unwrap(),
            "--meta",
            meta.to_str().unwrap(),
            "--out",
            out,
        ],
    ))
}

fn import_gpt2(dir: &Path, from: &Path, out: &str) -> String {
    ok(tinygpt(
        dir,
        &["import", "--from", from.to_str().unwrap(), "--out", out],
    ))
}

#[test]
fn nanogpt_checkpoint_gives_pytorchs_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let report = import_nanogpt(dir, "run");
    assert!(report.contains("nanoGPT checkpoint"), "{report}");
    assert!(report.contains("30 iterations"), "{report}");
    let run = Run::open(&dir.join("run")).unwrap();
    let m = &run.config.model;
    assert_eq!(
        (m.n_layer, m.n_head, m.n_embd, m.block_size),
        (2, 2, 32, 16)
    );
    assert!(m.tie_embeddings && m.bias);
    let want = expected("nanogpt");
    assert_eq!(run.tokenizer.encode(&want.text).unwrap(), want.tokens);
    for backend in ["flex", "fused"] {
        let ours = logits(dir, "run", &want.tokens, backend);
        let err = max_relative(&ours, &want.logits);
        eprintln!("nanoGPT fixture, {backend}: max relative error {err:.2e}");
        assert!(err <= 1e-4, "{backend}: {err}");
    }
}

/// An imported run's two checkpoints are one weights file on the disk (linked, not written
/// twice: at SmolLM2-1.7B's shape 6.8 GB), and a save that replaces `last` leaves `best`
/// whole: its bytes, its checksum.
#[cfg(unix)]
#[test]
fn an_imported_runs_checkpoints_share_one_weights_file() {
    use std::os::unix::fs::MetadataExt;
    use tinygpt::run::checkpoint::Which;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_nanogpt(dir, "run");
    let file = |which: &str| dir.join("run").join(which).join("model.safetensors");
    let inode = |which: &str| std::fs::metadata(file(which)).unwrap().ino();
    assert_eq!(inode("best"), inode("last"), "one file, linked into both");
    let best = std::fs::read(file("best")).unwrap();
    let run = Run::open(&dir.join("run")).unwrap();
    let (model, state) = run
        .load_model(Which::Best, &burn::tensor::Device::flex())
        .unwrap();
    run.save(Which::Last, &model, None, &state).unwrap();
    assert_ne!(inode("best"), inode("last"), "a save writes a new file");
    assert_eq!(std::fs::read(file("best")).unwrap(), best);
    assert!(run.verified(Which::Best).unwrap().warning.is_none());
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "run"]));
    assert!(info.contains("best step 0, checksums verified"), "{info}");
}

#[test]
fn hugging_face_directory_gives_transformers_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let report = import_gpt2(dir, &fixture("gpt2"), "run");
    assert!(report.contains("padded to 320"), "{report}");
    let run = Run::open(&dir.join("run")).unwrap();
    let m = &run.config.model;
    assert_eq!(m.vocab_size, 320);
    assert_eq!(run.tokenizer.vocab_size(), 300);
    assert_eq!(
        m.mlp,
        tinygpt_model::parts::Mlp::GeluTanh,
        "gelu_new is the tanh GELU"
    );
    let want = expected("gpt2");
    assert_eq!(run.tokenizer.encode(&want.text).unwrap(), want.tokens);
    let ours = logits(dir, "run", &want.tokens, "auto");
    let err = max_relative(&ours, &want.logits);
    eprintln!("GPT-2 fixture: max relative error {err:.2e}");
    assert!(err <= 1e-4, "{err}");
    // Sampling never produces a padding id: the text decodes.
    let text = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "run",
            "--prompt",
            "Of Man",
            "--max-new-tokens",
            "60",
            "--temperature",
            "2",
            "--top-k",
            "0",
        ],
    ));
    assert!(text.starts_with("Of Man"), "{text}");
}

/// The GPT-2 fixture's weights in two shards with `model.safetensors.index.json`, as
/// `save_pretrained` writes a model larger than its shard size: the same run as the one file.
#[test]
fn a_sharded_hugging_face_gpt2_directory_imports_as_the_single_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let sharded = gpt2_copy(dir, "sharded", |d| {
        let path = d.join("model.safetensors");
        let bytes = std::fs::read(&path).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<String> = file.names().into_iter().map(String::from).collect();
        names.sort();
        let mut weight_map = serde_json::Map::new();
        for (k, half) in names.chunks(names.len().div_ceil(2)).enumerate() {
            let shard = format!("model-0000{}-of-00002.safetensors", k + 1);
            let views: Vec<_> = half
                .iter()
                .map(|n| (n.clone(), file.tensor(n).unwrap()))
                .collect();
            std::fs::write(d.join(&shard), safetensors::serialize(views, None).unwrap()).unwrap();
            for n in half {
                weight_map.insert(n.clone(), shard.clone().into());
            }
        }
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        std::fs::remove_file(&path).unwrap();
    });
    import_gpt2(dir, &fixture("gpt2"), "one");
    import_gpt2(dir, &sharded, "two");
    let (one, two) = (weights(&dir.join("one")), weights(&dir.join("two")));
    assert!(!one.is_empty());
    assert!(
        one == two,
        "the sharded directory's weights differ from the one file's"
    );
}

/// A padded vocabulary (320 rows for 300 tokens) exported to nanoGPT's names and imported
/// again: the sidecar's `vocab_size` is the rows, as nanoGPT's `GPTConfig` has it.
#[test]
fn a_padded_model_exported_for_nanogpt_imports_back_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_gpt2(dir, &fixture("gpt2"), "padded");
    let export = [
        "export",
        "--checkpoint",
        "padded",
        "--format",
        "nanogpt",
        "--out",
        "padded.safetensors",
    ];
    ok(tinygpt(dir, &export));
    let sidecar: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("padded.json")).unwrap()).unwrap();
    assert_eq!(sidecar["config"]["vocab_size"], 320, "{sidecar}");
    let report = ok(tinygpt(
        dir,
        &["import", "--from", "padded.safetensors", "--out", "back"],
    ));
    assert!(report.contains("padded to 320"), "{report}");
    let (a, b) = (
        Run::open(&dir.join("padded")).unwrap(),
        Run::open(&dir.join("back")).unwrap(),
    );
    assert_eq!(b.config.model.vocab_size, 320);
    assert_eq!(b.tokenizer.vocab_size(), a.tokenizer.vocab_size());
    let tokens = a.tokenizer.encode("Of Man's first").unwrap();
    let err = max_relative(
        &logits(dir, "back", &tokens, "flex"),
        &logits(dir, "padded", &tokens, "flex"),
    );
    assert!(err <= 1e-6, "{err}");
}

#[test]
fn hf_export_reads_back_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A char model of tinygpt's own, untied, without biases and with a narrower MLP: what
    // GPT-2 lacks is filled in (zero biases, an explicit head), the MLP's width is `n_inner`.
    ok(train(
        dir,
        "char",
        &[
            "--max-iters",
            "6",
            "--set",
            "model.bias=false",
            "--set",
            "model.tie_embeddings=false",
            "--set",
            "model.mlp_hidden=40",
        ],
    ));
    let export = [
        "export",
        "--checkpoint",
        "char",
        "--format",
        "hf",
        "--out",
        "hf-char",
    ];
    ok(tinygpt(dir, &export));
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(dir.join("hf-char").join(file).is_file(), "{file}");
    }
    import_gpt2(dir, &dir.join("hf-char"), "back");
    let (a, b) = (
        Run::open(&dir.join("char")).unwrap(),
        Run::open(&dir.join("back")).unwrap(),
    );
    assert_eq!(
        b.tokenizer.chars(),
        a.tokenizer.chars(),
        "still a char vocabulary"
    );
    assert!(!b.config.model.tie_embeddings);
    assert_eq!(b.config.model.mlp_hidden, Some(40));
    let tokens = a.tokenizer.encode("Of Man's first d").unwrap();
    let err = max_relative(
        &logits(dir, "back", &tokens, "flex"),
        &logits(dir, "char", &tokens, "flex"),
    );
    assert!(err <= 1e-6, "{err}");
    // The exported directory is refused as a destination now that it exists.
    fails(tinygpt(dir, &export), "not empty");
}

#[test]
fn fine_tuning_starts_from_the_source_and_keeps_its_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    import_nanogpt(dir, "source");
    // The part of Paradise Lost whose characters the source's vocabulary was made from.
    let text: String = std::fs::read_to_string(corpus())
        .unwrap()
        .chars()
        .take(20000)
        .collect();
    let milton = dir.join("milton.txt");
    std::fs::write(&milton, text).unwrap();
    // A vanishing learning rate: after a step the weights are still the source's.
    let log = ok(tinygpt(
        dir,
        &[
            "train",
            "--config",
            "finetune",
            "--init-from",
            "source",
            "--data",
            milton.to_str().unwrap(),
            "--out",
            "tuned",
            "--backend",
            "flex",
            "--max-iters",
            "1",
            "--set",
            "train.learning_rate=1e-12",
            "--set",
            "train.min_lr=1e-12",
            "--set",
            "train.eval_iters=1",
        ],
    ));
    assert!(log.contains("done: step 1"), "{log}");
    let (source, tuned) = (
        Run::open(&dir.join("source")).unwrap(),
        Run::open(&dir.join("tuned")).unwrap(),
    );
    let mut model = tuned.config.model.clone();
    assert_eq!(model.dropout, 0.1, "finetune.toml's dropout");
    model.dropout = source.config.model.dropout;
    assert_eq!(model, source.config.model, "the source's architecture");
    assert_eq!(tuned.tokenizer.chars(), source.tokenizer.chars());
    let tokens = source.tokenizer.encode("Of Man's first d").unwrap();
    let err = max_relative(
        &logits(dir, "tuned", &tokens, "flex"),
        &logits(dir, "source", &tokens, "flex"),
    );
    assert!(err <= 1e-5, "{err}");
    // A corpus with characters the source's vocabulary lacks: an error listing them.
    std::fs::write(
        dir.join("new.txt"),
        "Of Man's first disobedience — and ZQX\n".repeat(50),
    )
    .unwrap();
    let out = tinygpt(
        dir,
        &[
            "train",
            "--config",
            "finetune",
            "--init-from",
            "source",
            "--data",
            "new.txt",
            "--out",
            "bad",
        ],
    );
    fails(out, "'—'");
    assert!(!dir.join("bad").exists());
    fails(
        tinygpt(
            dir,
            &[
                "train",
                "--init-from",
                "nowhere",
                "--out",
                "bad2",
                "--max-iters",
                "1",
            ],
        ),
        "nowhere",
    );
}

/// Copies the GPT-2 fixture into `dir/name`, then lets `edit` change it.
fn gpt2_copy(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let to = dir.join(name);
    std::fs::create_dir(&to).unwrap();
    for entry in std::fs::read_dir(fixture("gpt2")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    edit(&to);
    to
}

fn edit_config(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config[key] = value;
    std::fs::write(&path, config.to_string()).unwrap();
}

/// Rewrites the fixture's weights without `drop`, or with `reshape`'s tensor cut to one row.
fn edit_weights(dir: &Path, drop: Option<&str>, reshape: Option<&str>) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept = Vec::new();
    for (name, view) in file.tensors() {
        if Some(name.as_str()) == drop {
            continue;
        }
        let mut shape = view.shape().to_vec();
        let mut data = view.data().to_vec();
        if Some(name.as_str()) == reshape {
            let row: usize = shape[1..].iter().product();
            shape[0] = 1;
            data.truncate(row * 4);
        }
        kept.push((name, shape, data));
    }
    let views: Vec<_> = kept
        .iter()
        .map(|(n, s, d)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), d)
                .unwrap();
            (n.clone(), view)
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn bad_imports_are_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ckpt = fixture("nanogpt/ckpt.pt");
    let meta = fixture("nanogpt/meta.pkl");
    let (ckpt, meta) = (ckpt.to_str().unwrap(), meta.to_str().unwrap());
    let import = |args: &[&str]| {
        let mut all = vec!["import", "--out", "run"];
        all.extend(args);
        tinygpt(dir, &all)
    };
    // A pickle that is not a checkpoint.
    fails(import(&["--from", meta]), "not a nanoGPT checkpoint");
    // No tokenizer: the error says which file nanoGPT wrote.
    fails(
        import(&["--from", ckpt]),
        "--meta data/paradise_lost_char/meta.pkl",
    );
    // A tokenizer that does not belong to the checkpoint (300 tokens for 64 rows).
    let gpt2_tokenizer = fixture("gpt2/tokenizer.json");
    fails(
        import(&[
            "--from",
            ckpt,
            "--tokenizer",
            gpt2_tokenizer.to_str().unwrap(),
        ]),
        "do not belong together",
    );
    // Not a checkpoint at all.
    std::fs::write(dir.join("junk.pt"), b"hello").unwrap();
    fails(import(&["--from", "junk.pt", "--meta", meta]), "junk.pt");
    // Another architecture, by config.json: a GPT-2 config that calls itself Llama is read as
    // one, and lacks Llama's keys; an architecture tinygpt does not know is named.
    gpt2_copy(dir, "llama", |d| {
        edit_config(d, "model_type", "llama".into())
    });
    fails(
        import(&["--from", "llama"]),
        "not a Llama config (missing field `hidden_size`)",
    );
    gpt2_copy(dir, "mamba", |d| {
        edit_config(d, "model_type", "mamba".into())
    });
    fails(
        import(&["--from", "mamba"]),
        "\"mamba\" is not GPT-2 or Llama",
    );
    gpt2_copy(dir, "relu", |d| {
        edit_config(d, "activation_function", "relu".into())
    });
    fails(import(&["--from", "relu"]), "relu");
    // Missing tensors and wrong shapes name the file and the tensor.
    gpt2_copy(dir, "missing", |d| {
        edit_weights(d, Some("transformer.h.1.mlp.c_fc.weight"), None)
    });
    fails(
        import(&["--from", "missing"]),
        "model.safetensors: tensor `transformer.h.1.mlp.c_fc.weight` is missing",
    );
    gpt2_copy(dir, "shape", |d| {
        edit_weights(d, None, Some("transformer.h.0.attn.c_proj.weight"))
    });
    fails(
        import(&["--from", "shape"]),
        "tensor `transformer.h.0.attn.c_proj.weight` has shape [1, 32]",
    );
    gpt2_copy(dir, "wide", |d| edit_config(d, "n_embd", 64.into()));
    fails(import(&["--from", "wide"]), "has shape");
    gpt2_copy(dir, "notok", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap()
    });
    fails(import(&["--from", "notok"]), "no tokenizer.json");
    fails(import(&["--from", "nothing-here"]), "does not exist");
    assert!(!dir.join("run").exists(), "a failed import leaves no run");
    // An existing run is never overwritten.
    import_nanogpt(dir, "run");
    let before = std::fs::read(dir.join("run/best/model.safetensors")).unwrap();
    fails(import(&["--from", "llama"]), "already holds a run");
    assert_eq!(
        std::fs::read(dir.join("run/best/model.safetensors")).unwrap(),
        before
    );
}

/// The round trip through the real transformers: `export --format hf` for a char and a BPE run,
/// loaded by `GPT2LMHeadModel` / `AutoTokenizer`, gives tinygpt's logits, token ids and greedy
/// text. Needs a Python with torch and transformers, so it is reported as ignored unless asked
/// for (`cargo test --release -- --ignored`); asked for without one, it fails saying why.
#[test]
#[ignore = "needs Python with torch + transformers (TINYGPT_PYTHON): cargo test --release -- --ignored"]
fn transformers_loads_hf_exports_needs_python() {
    let python = std::env::var("TINYGPT_PYTHON").unwrap_or_else(|_| "python3".into());
    let has = Command::new(&python)
        .args(["-c", "import torch, transformers"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        has,
        "needs `{python}` with torch + transformers (set TINYGPT_PYTHON)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(
        dir,
        "char",
        &["--max-iters", "30", "--set", "model.activation=gelu_tanh"],
    ));
    let bpe = [
        "--max-iters",
        "30",
        "--set",
        "data.tokenizer=bpe",
        "--set",
        "data.bpe_vocab_size=300",
    ];
    ok(train(dir, "bpe", &bpe));
    // Llama's parts, which export as `LlamaForCausalLM`.
    ok(train(dir, "llama", &[&bpe[..], LLAMA].concat()));
    for run in ["char", "bpe", "llama"] {
        let hf = format!("{run}-hf");
        ok(tinygpt(
            dir,
            &[
                "export",
                "--checkpoint",
                run,
                "--format",
                "hf",
                "--out",
                &hf,
            ],
        ));
        // Prompt and continuation stay inside the 16-token context, where GPT-2 must stay.
        let prompt = "Of Man";
        let tokens = Run::open(&dir.join(run))
            .unwrap()
            .tokenizer
            .encode(prompt)
            .unwrap();
        let ours = logits(dir, run, &tokens, "flex");
        let greedy = ok(tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                run,
                "--prompt",
                prompt,
                "--max-new-tokens",
                "8",
                "--temperature",
                "0",
                "--backend",
                "flex",
            ],
        ));
        let script = format!(
            "import json, torch\n\
             from transformers import AutoModelForCausalLM, AutoTokenizer\n\
             m = AutoModelForCausalLM.from_pretrained('{hf}').eval()\n\
             t = AutoTokenizer.from_pretrained('{hf}')\n\
             ids = t(\"{prompt}\")['input_ids']\n\
             with torch.no_grad():\n    logits = m(torch.tensor([ids])).logits[0].tolist()\n\
             out = m.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)\n\
             text = t.decode(out[0].tolist())\n\
             bos = [t.bos_token_id, t.eos_token_id, m.config.bos_token_id, m.config.eos_token_id]\n\
             print(json.dumps({{'ids': ids, 'logits': logits, 'text': text, 'bos': bos}}))\n"
        );
        let theirs = Command::new(&python)
            .args(["-c", &script])
            .current_dir(dir)
            .output()
            .unwrap();
        let theirs: serde_json::Value =
            serde_json::from_str(ok(theirs).lines().last().unwrap()).unwrap();
        let ids: Vec<u32> = serde_json::from_value(theirs["ids"].clone()).unwrap();
        assert_eq!(ids, tokens, "{run}: token ids");
        // The end-of-text token is the tokenizer's and the model's BOS and EOS, as harnesses
        // read them.
        let eot = Run::open(&dir.join(run)).unwrap().tokenizer.start_of_text();
        assert_eq!(
            theirs["bos"],
            serde_json::json!(vec![eot; 4]),
            "{run}: BOS and EOS"
        );
        let logits: Vec<Vec<f64>> = serde_json::from_value(theirs["logits"].clone()).unwrap();
        let err = max_relative(&ours, &logits);
        eprintln!("{run}: transformers vs tinygpt logits, max relative error {err:.2e}");
        assert!(err <= 1e-4, "{run}: {err}");
        let greedy = greedy.strip_suffix('\n').unwrap_or(&greedy);
        assert_eq!(
            theirs["text"].as_str().unwrap(),
            greedy,
            "{run}: greedy text"
        );
    }
    chat::transformers_reads_exported_chat_templates(dir, &python);
}
