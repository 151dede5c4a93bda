//! `tinygpt import --from FILE.gguf`: tinygpt's own exports (llama.cpp's `gpt2` and `llama`)
//! come back as the same model, bit for bit, with the tokenizer llama.cpp tokenizes with; the
//! imported run samples, fine-tunes and exports again; ggml's quantised types dequantise as
//! llama.cpp's Python reader does; bad files are one line and write nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use half::f16;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tinygpt::interop::gguf::{Gguf, Tensor, TensorType, Value, quant};
use tinygpt::run::checkpoint::Run;

fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/gguf").join(name)
}

fn export(dir: &Path, run: &Path, dtype: &str, out: &str) {
    let run = run.to_str().unwrap();
    let args = [
        "export",
        "--checkpoint",
        run,
        "--format",
        "gguf",
        "--dtype",
        dtype,
        "--out",
        out,
    ];
    ok(tinygpt(dir, &args));
}

fn sha(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// Each fixture run (char GPT-2, BPE GPT-2, Llama-shaped, QK-norm as qwen3) exported, imported and exported
/// again: the same logits bit for bit, llama.cpp's token ids from the imported tokenizer, and
/// the second export byte for byte the first (chat template and end-of-turn token included).
#[test]
fn an_exported_run_imports_as_the_same_model_and_exports_as_the_same_file() {
    for name in ["char", "bpe", "llama", "qwen3"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let source = fixture(name);
        export(dir, &source, "f32", "first.gguf");
        // Named as the source, so that `general.name` is the same in the second export.
        let log = ok(tinygpt(
            dir,
            &["import", "--from", "first.gguf", "--out", name],
        ));
        let kind = if name == "char" { "char" } else { "bpe" };
        assert!(log.contains(&format!("{kind} tokenizer")), "{log}");
        let seen: Json =
            serde_json::from_str(&std::fs::read_to_string(source.join("llamacpp.json")).unwrap())
                .unwrap();
        let imported = Run::open(&dir.join(name)).unwrap();
        // A reply ends where the source's did (the end-of-turn token and EOS).
        let source_run = Run::open(&source).unwrap();
        assert_eq!(
            imported.config.chat.stop, source_run.config.chat.stop,
            "{name}"
        );
        assert_eq!(
            imported.config.chat.template, source_run.config.chat.template,
            "{name}"
        );
        let tokenizer = imported.tokenizer;
        for text in seen["texts"].as_array().unwrap() {
            let ids: Vec<u32> = serde_json::from_value(text["ids"].clone()).unwrap();
            let text = text["text"].as_str().unwrap();
            assert_eq!(
                tokenizer.encode_with_specials(text).unwrap(),
                ids,
                "{name}: {text:?}"
            );
        }
        let prompt: Vec<u32> = serde_json::from_value(seen["prompt"].clone()).unwrap();
        let source_arg = source.to_str().unwrap();
        assert_eq!(
            logits(dir, name, &prompt, "flex"),
            logits(dir, source_arg, &prompt, "flex"),
            "{name}"
        );
        export(dir, &dir.join(name), "f32", "second.gguf");
        assert_eq!(
            sha(&dir.join("first.gguf")),
            sha(&dir.join("second.gguf")),
            "{name}"
        );
    }
}

/// A q8_0 file imports dequantised: weights within half a quantisation step of the f32 ones;
/// quantised again (an export, or sampling with `--weights q8_0`) they are the file's bytes
/// exactly; and the imported run samples, fine-tunes from its weights, and exports.
#[test]
fn a_quantised_llama_imports_samples_and_fine_tunes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let source = fixture("llama");
    export(dir, &source, "q8_0", "q.gguf");
    ok(tinygpt(dir, &["import", "--from", "q.gguf", "--out", "q"]));
    let (exact, imported) = (weights_best(&source), weights_best(&dir.join("q")));
    for ((name, x), (_, y)) in exact.iter().zip(&imported) {
        let scale = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = x.iter().zip(y).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= scale / 127.0, "{name}: {worst} of {scale}");
    }
    // Imported under the source's name, which the file records as `general.name`.
    ok(tinygpt(
        dir,
        &["import", "--from", "q.gguf", "--out", "llama"],
    ));
    export(dir, &dir.join("llama"), "q8_0", "requantised.gguf");
    let (first, again) = (dir.join("q.gguf"), dir.join("requantised.gguf"));
    assert!(std::fs::read(first).unwrap() == std::fs::read(again).unwrap());
    let out = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "q",
            "--prompt",
            "Of Man",
            "--max-new-tokens",
            "20",
            "--temperature",
            "0",
        ],
    ));
    assert!(out.starts_with("Of Man") && out.len() > 10, "{out}");
    let corpus = corpus();
    let args = [
        "train",
        "--config",
        "finetune",
        "--init-from",
        "q",
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        "ft",
        "--max-iters",
        "2",
        "--set",
        "train.batch_size=2",
        "--set",
        "train.eval_iters=1",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.sample_tokens=0",
        "--set",
        "model.block_size=32",
    ];
    let log = ok(tinygpt(dir, &args));
    assert!(log.contains("done: step 2"), "{log}");
    export(dir, &dir.join("q"), "f32", "again.gguf");
    // An imported model has no training to continue: `--resume` says what to do instead, and
    // leaves the run as it was.
    let before = std::fs::read(dir.join("q/best/model.safetensors")).unwrap();
    let resume = ["train", "--resume", "--out", "q", "--max-iters", "2"];
    fails(
        tinygpt(dir, &resume),
        "fine-tune it into a new run with --init-from",
    );
    assert!(std::fs::read(dir.join("q/best/model.safetensors")).unwrap() == before);
}

/// `best`'s weights, (name, values) in name order.
fn weights_best(run: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(run.join("best/model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, quant::decode(view.data(), TensorType::F32).unwrap()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Bytes from a fixed generator, each block's f16 scales set to ordinary numbers (a random
/// f16 may be infinite or not a number).
fn blocks(kind: TensorType, count: usize, seed: u64) -> Vec<u8> {
    let (_, size) = kind.block();
    let mut state = seed;
    let mut bytes: Vec<u8> = (0..count * size)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect();
    let scales: &[usize] = match kind {
        TensorType::Q4_0 | TensorType::Q5_0 | TensorType::Q8_0 => &[0],
        TensorType::Q4_1 | TensorType::Q5_1 | TensorType::Q4_K | TensorType::Q5_K => &[0, 2],
        TensorType::Q6_K => &[208],
        _ => &[],
    };
    for (i, block) in bytes.chunks_mut(size).enumerate() {
        for &at in scales {
            let d = f16::from_f32(0.001 + (i * 7 + at) as f32 * 0.0137);
            block[at..at + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    bytes
}

#[test]
#[cfg_attr(
    no_client_python,
    ignore = "no Python with gguf (set TINYGPT_CLIENTS_PYTHON, then rebuild)"
)]
fn every_quantised_type_dequantises_as_llama_cpps_reader_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let kinds = [
        (TensorType::Q4_0, 32),
        (TensorType::Q4_1, 32),
        (TensorType::Q5_0, 32),
        (TensorType::Q5_1, 32),
        (TensorType::Q8_0, 32),
        (TensorType::Q4_K, 256),
        (TensorType::Q5_K, 256),
        (TensorType::Q6_K, 256),
        (TensorType::F16, 1),
        (TensorType::BF16, 1),
    ];
    let tensors: Vec<Tensor> = kinds
        .iter()
        .enumerate()
        .map(|(i, &(kind, block))| {
            let data = match kind {
                TensorType::F16 | TensorType::BF16 => {
                    let values: Vec<f32> = (0..64).map(|v| (v as f32 - 31.5) * 0.37).collect();
                    quant::encode(&values, kind).unwrap()
                }
                _ => blocks(kind, 6, i as u64 + 1),
            };
            let rows = match block {
                1 => 2,
                _ => 3,
            };
            let per_row = match block {
                1 => 32,
                b => 2 * b,
            };
            Tensor {
                name: kind.name().into(),
                ne: vec![per_row, rows],
                kind,
                data,
            }
        })
        .collect();
    let file = Gguf {
        metadata: vec![("general.architecture".into(), Value::Str("test".into()))],
        tensors,
    };
    std::fs::write(dir.join("q.gguf"), file.to_bytes().unwrap()).unwrap();
    let out = Command::new(client_python())
        .arg(manifest_dir().join("tests/gguf_check.py"))
        .args(["--dequantize", "q.gguf"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let theirs: serde_json::Map<String, Json> = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(theirs.len(), kinds.len());
    for t in &file.tensors {
        let mine = quant::decode(&t.data, t.kind).unwrap();
        let theirs: Vec<f32> = serde_json::from_value(theirs[&t.name].clone()).unwrap();
        assert_eq!(mine.len() as u64, t.ne[0] * t.ne[1], "{}", t.name);
        assert_eq!(mine, theirs, "{}", t.name);
    }
}

/// Writes `file` with the metadata `key` set to `value`.
fn with(file: &Gguf, key: &str, value: Value) -> Vec<u8> {
    let mut file = file.clone();
    match file.metadata.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value,
        None => file.metadata.push((key.into(), value)),
    }
    file.to_bytes().unwrap()
}

#[test]
fn bad_gguf_files_are_one_line_and_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    export(dir, &fixture("bpe"), "f32", "good.gguf");
    let good = std::fs::read(dir.join("good.gguf")).unwrap();
    let file = Gguf::from_bytes(&good).unwrap();
    let mut tensor_too_small = file.clone();
    tensor_too_small
        .metadata
        .push(("gpt2.embedding_length".into(), Value::U32(64)));
    tensor_too_small.metadata.swap_remove(
        file.metadata
            .iter()
            .position(|(k, _)| k == "gpt2.embedding_length")
            .unwrap(),
    );
    let mut no_pre = file.clone();
    no_pre.metadata.retain(|(k, _)| k != "tokenizer.ggml.pre");
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "truncated",
            good[..good.len() - 100].to_vec(),
            "truncated.gguf: ",
        ),
        (
            "magic",
            [b"GGUX".as_slice(), &good[4..]].concat(),
            "not a GGUF file",
        ),
        (
            "architecture",
            with(&file, "general.architecture", Value::Str("mamba".into())),
            "architecture \"mamba\" is not one tinygpt imports (gpt2, llama, qwen3)",
        ),
        (
            "sentencepiece-without-scores",
            with(&file, "tokenizer.ggml.model", Value::Str("llama".into())),
            "its SentencePiece tokenizer has no tokenizer.ggml.scores",
        ),
        (
            "pre-tokenizer",
            with(
                &file,
                "tokenizer.ggml.pre",
                Value::Str("deepseek-coder".into()),
            ),
            "tokenizer.ggml.pre \"deepseek-coder\" is not one tinygpt reads",
        ),
        (
            "no-pre-tokenizer",
            no_pre.to_bytes().unwrap(),
            "names no pre-tokenizer (tokenizer.ggml.pre)",
        ),
        ("shape", tensor_too_small.to_bytes().unwrap(), "has shape"),
    ];
    // A Qwen3 whose QK-norm learned gains (every real one).
    export(dir, &fixture("qwen3"), "f32", "qwen3.gguf");
    let mut learned = Gguf::from_bytes(&std::fs::read(dir.join("qwen3.gguf")).unwrap()).unwrap();
    let gain = learned
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.attn_k_norm.weight")
        .unwrap();
    gain.data[..4].copy_from_slice(&1.5f32.to_le_bytes());
    cases.push((
        "learned-qk-gains",
        learned.to_bytes().unwrap(),
        "blk.1.attn_k_norm.weight holds learned QK-norm gains",
    ));
    for (name, bytes, expected) in cases {
        let from = format!("{name}.gguf");
        std::fs::write(dir.join(&from), bytes).unwrap();
        fails(
            tinygpt(dir, &["import", "--from", &from, "--out", name]),
            expected,
        );
        assert!(
            !dir.join(name).exists(),
            "{name}: a refused import wrote its run"
        );
    }
}
