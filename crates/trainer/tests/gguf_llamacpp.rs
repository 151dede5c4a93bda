//! tinygpt's GGUF exports against what the real llama.cpp computed from them: for a char GPT-2,
//! a BPE GPT-2 and a Llama-shaped model (`tests/fixtures/gguf/`), llama.cpp's token ids for
//! texts with non-ASCII characters and special tokens, the logits of a prompt and its greedy
//! continuation of 100 tokens, each equal to tinygpt's own. The logits agree to 1e-4 of each
//! row's largest for `llama`; for `gpt2` to 1e-3, because llama.cpp's CPU GELU reads a table of
//! f16 values (ggml's `GGML_GELU_FP16`: the input and the result rounded to f16).
//! `scripts/gguf-llamacpp.py` ran llama.cpp on each export and saved what it said; the export
//! written here must be that very file (its SHA-256), so a change to the exporter fails here
//! until the script has checked it again.

mod common;

use std::path::PathBuf;

use common::*;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tinygpt::run::checkpoint::Run;

#[derive(Deserialize)]
struct LlamaCpp {
    gguf_sha256: String,
    eos: Option<u32>,
    texts: Vec<Text>,
    prompt: Vec<u32>,
    logits: Vec<Vec<f64>>,
    greedy: Vec<u32>,
}

#[derive(Deserialize)]
struct Text {
    text: String,
    ids: Vec<u32>,
}

fn fixture(name: &str) -> PathBuf {
    manifest_dir().join("tests/fixtures/gguf").join(name)
}

fn check(name: &str, tolerance: f64) {
    let run = fixture(name);
    let run_arg = run.to_str().unwrap();
    let seen: LlamaCpp =
        serde_json::from_str(&std::fs::read_to_string(run.join("llamacpp.json")).unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let args = [
        "export",
        "--checkpoint",
        run_arg,
        "--format",
        "gguf",
        "--out",
        "m.gguf",
    ];
    ok(tinygpt(dir, &args));
    let sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(dir.join("m.gguf")).unwrap())
    );
    assert_eq!(
        sha, seen.gguf_sha256,
        "{name}: the export is not the file llama.cpp checked; run scripts/gguf-llamacpp.py"
    );
    let tokenizer = Run::open(&run).unwrap().tokenizer;
    for text in &seen.texts {
        let ours = tokenizer.encode_with_specials(&text.text).unwrap();
        assert_eq!(ours, text.ids, "{name}: {:?}", text.text);
    }
    assert_eq!(seen.prompt, seen.texts[0].ids);
    let ours = logits(dir, run_arg, &seen.prompt, "flex");
    assert_eq!(ours.len(), seen.logits.len());
    for (at, (a, b)) in ours.iter().zip(&seen.logits).enumerate() {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= tolerance * scale,
            "{name} position {at}: {worst} of {scale}"
        );
    }
    let prompt = &seen.texts[0].text;
    let generated = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            run_arg,
            "--prompt",
            prompt,
            "--temperature",
            "0",
            "--max-new-tokens",
            "100",
            "--backend",
            "flex",
        ],
    ));
    let end = seen.greedy.iter().position(|&t| Some(t) == seen.eos);
    let continuation = tokenizer
        .decode(&seen.greedy[..end.unwrap_or(seen.greedy.len())])
        .unwrap();
    assert_eq!(generated, format!("{prompt}{continuation}\n"), "{name}");
}

#[test]
fn a_char_gpt2_computes_in_llama_cpp_what_it_computes_here() {
    check("char", 1e-3);
}

#[test]
fn a_bpe_gpt2_with_biases_computes_in_llama_cpp_what_it_computes_here() {
    check("bpe", 1e-3);
}

#[test]
fn a_llama_with_grouped_queries_computes_in_llama_cpp_what_it_computes_here() {
    check("llama", 1e-4);
}
