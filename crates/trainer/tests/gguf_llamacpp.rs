//! tinygpt's GGUF exports against what the real llama.cpp computed from them: for a char GPT-2,
//! a BPE GPT-2, the `baby` preset's exact GELU (approximated with tanh, within the difference the
//! export states), a Llama-shaped model, one with QK-norm (`qwen3`) and one with ReLU² (`arcee`;
//! `tests/fixtures/gguf/`), llama.cpp's token ids for
//! texts with non-ASCII characters and special tokens, the logits of a prompt and its greedy
//! continuation of 100 tokens, each equal to tinygpt's own. The logits agree to 1e-4 of each
//! row's largest for `llama`; for `gpt2` to 1e-3, because llama.cpp's CPU GELU reads a table of
//! f16 values (ggml's `GGML_GELU_FP16`: the input and the result rounded to f16).
//! `scripts/gguf-llamacpp.py` ran llama.cpp on each export and saved what it said; the export
//! written here must be that very file (its SHA-256), so a change to the exporter fails here
//! until the script has checked it again. llama.cpp's own converter (`convert_hf_to_gguf.py`,
//! run by `scripts/gguf-converter.py`) made `converter.gguf` from tinygpt's Hugging Face export of
//! the BPE and Llama runs: it must hold the very tensors tinygpt's export writes, and import to
//! what llama.cpp computed.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tinygpt::data::tokenizer::TextStream;
use tinygpt::interop::gguf::file::Gguf;
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

/// What llama.cpp computed for the fixture `name` (its `llamacpp.json`).
fn llama_cpp_said(name: &str) -> LlamaCpp {
    let text = std::fs::read_to_string(fixture(name).join("llamacpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn check(name: &str, tolerance: f64) {
    check_within(name, tolerance, false);
}

/// [`check`], the logits allowed also the largest difference the export states it measured
/// (where it approximates a part) when `stated` is set; returns the export's output.
fn check_within(name: &str, tolerance: f64, stated: bool) -> String {
    let run = fixture(name);
    let seen = llama_cpp_said(name);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let report = export_f32(dir, &run);
    assert_eq!(
        sha256(&dir.join("m.gguf")),
        seen.gguf_sha256,
        "{name}: the export is not the file llama.cpp checked; run scripts/gguf-llamacpp.py"
    );
    let absolute = match stated {
        true => stated_difference(&report),
        false => 0.0,
    };
    compare(name, &run, &seen, tolerance, absolute);
    report
}

/// `tinygpt export --format gguf` (f32) of the run `run` into `dir/m.gguf`; its output.
fn export_f32(dir: &Path, run: &Path) -> String {
    let run = run.to_str().unwrap();
    let args = [
        "export",
        "--checkpoint",
        run,
        "--format",
        "gguf",
        "--out",
        "m.gguf",
    ];
    ok(tinygpt(dir, &args))
}

/// The largest logit difference an export's report states ("differ by at most D").
fn stated_difference(report: &str) -> f64 {
    let after = "differ by at most ";
    let at = report
        .find(after)
        .unwrap_or_else(|| panic!("no measured difference in {report}"))
        + after.len();
    report[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn sha256(file: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(file).unwrap()))
}

/// The run `run` tokenizes `seen`'s texts into llama.cpp's ids, computes the logits of the
/// prompt to `tolerance` of each row's largest (plus `absolute`), and continues it greedily with
/// llama.cpp's tokens.
fn compare(name: &str, run: &Path, seen: &LlamaCpp, tolerance: f64, absolute: f64) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let run_arg = run.to_str().unwrap();
    let tokenizer = Run::open(run).unwrap().tokenizer;
    for text in &seen.texts {
        let ours = tokenizer.encode_with_specials(&text.text).unwrap();
        assert_eq!(ours, text.ids, "{name}: {:?}", text.text);
    }
    // A prompt starts as llama.cpp starts it: with BOS where the file says so.
    let prompt_ids = tokenizer.encode_prompt(&seen.texts[0].text).unwrap();
    assert_eq!(seen.prompt, prompt_ids, "{name}: the prompt");
    let ours = logits(dir, run_arg, &seen.prompt, "flex");
    assert_eq!(ours.len(), seen.logits.len());
    for (at, (a, b)) in ours.iter().zip(&seen.logits).enumerate() {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(b).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            worst <= tolerance * scale + absolute,
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
            &seen.greedy.len().to_string(),
            "--backend",
            "flex",
        ],
    ));
    // llama.cpp's tokens as text, streamed after the prompt as `generate` streams its own (a
    // SentencePiece decoder drops the space of a text's first token, not of a continuation's).
    let end = seen.greedy.iter().position(|&t| Some(t) == seen.eos);
    let mut stream = TextStream::after(&tokenizer, &seen.prompt);
    let mut continuation = String::new();
    for &id in &seen.greedy[..end.unwrap_or(seen.greedy.len())] {
        continuation.extend(stream.push(id));
    }
    continuation.extend(stream.finish());
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

/// The `baby` preset's parts: nanoGPT's exact GELU, which llama.cpp's `gpt2` computes with
/// tanh's approximation. The export says so and states the largest logit difference it measured
/// on the run's validation text; llama.cpp's logits are within it (and ggml's f16 GELU table's
/// 1e-3 of a row, as for the other `gpt2` runs), and its greedy text is tinygpt's.
#[test]
fn the_baby_presets_exact_gelu_computes_in_llama_cpp_within_the_stated_difference() {
    let report = check_within("baby", 1e-3, true);
    assert!(
        report.contains("GELU with tanh's approximation"),
        "{report}"
    );
    assert!(stated_difference(&report) > 0.0, "{report}");
}

#[test]
fn a_llama_with_grouped_queries_computes_in_llama_cpp_what_it_computes_here() {
    check("llama", 1e-4);
}

/// ReLU² and a gain-less RMSNorm (the `modern` preset's, without its QK-norm and soft-cap) as
/// llama.cpp's `arcee`; the file imported back is the same model.
#[test]
fn a_relu2_model_computes_in_llama_cpps_arcee_what_it_computes_here() {
    check("arcee", 1e-4);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let run = fixture("arcee");
    export_f32(dir, &run);
    let report = ok(tinygpt(
        dir,
        &["import", "--from", "m.gguf", "--out", "back"],
    ));
    assert!(report.contains("llama.cpp's arcee"), "{report}");
    let (ours, back) = (
        Run::open(&run).unwrap(),
        Run::open(&dir.join("back")).unwrap(),
    );
    assert_eq!(back.config.model.mlp, ours.config.model.mlp);
    assert_eq!(back.config.model.mlp_width(), ours.config.model.mlp_width());
    let seen = llama_cpp_said("arcee");
    let (a, b) = (
        logits(dir, run.to_str().unwrap(), &seen.prompt, "flex"),
        logits(dir, "back", &seen.prompt, "flex"),
    );
    assert_eq!(a, b, "the imported file computes what the run does");
}

/// QK-norm and a gain-less RMSNorm (the `modern` preset's) as llama.cpp's `qwen3`.
#[test]
fn a_qk_norm_model_computes_in_llama_cpps_qwen3_what_it_computes_here() {
    check("qwen3", 1e-4);
}

/// A Llama GGUF with a SentencePiece vocabulary (byte fallback, control and user-defined
/// tokens), made by `scripts/gguf-spm-fixture.py`: imported, it tokenizes, scores and continues
/// as llama.cpp did.
#[test]
fn a_sentencepiece_llama_gguf_imports_to_what_llama_cpp_computes() {
    let file = fixture("spm").join("model.gguf");
    let seen = llama_cpp_said("spm");
    assert_eq!(
        sha256(&file),
        seen.gguf_sha256,
        "the file is not the one llama.cpp ran"
    );
    let tmp = tempfile::tempdir().unwrap();
    let args = ["import", "--from", file.to_str().unwrap(), "--out", "run"];
    ok(tinygpt(tmp.path(), &args));
    compare("spm", &tmp.path().join("run"), &seen, 1e-4, 0.0);
}

/// The SentencePiece Llama imported, then exported: the file's vocabulary is SentencePiece's
/// again (the same tokens and types; scores that order its joins as the original's did, which
/// llama.cpp ran: docs/interop.md), and imported once more it tokenizes, scores and continues
/// as llama.cpp did on the original.
#[test]
fn a_sentencepiece_llama_gguf_exports_back_as_sentencepiece() {
    let file = fixture("spm").join("model.gguf");
    let seen = llama_cpp_said("spm");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tinygpt(
        dir,
        &["import", "--from", file.to_str().unwrap(), "--out", "run"],
    ));
    ok(tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            "run",
            "--format",
            "gguf",
            "--out",
            "again.gguf",
        ],
    ));
    let read = |path: &Path| Gguf::from_bytes(&std::fs::read(path).unwrap()).unwrap();
    let (original, again) = (read(&file), read(&dir.join("again.gguf")));
    for key in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
    ] {
        assert_eq!(again.get(key), original.get(key), "{key}");
    }
    assert!(again.get("tokenizer.ggml.merges").is_none());
    ok(tinygpt(
        dir,
        &["import", "--from", "again.gguf", "--out", "back"],
    ));
    compare("spm", &dir.join("back"), &seen, 1e-4, 0.0);
}

/// `NAME/converter.gguf`, written by llama.cpp's converter from tinygpt's Hugging Face export of
/// the run: its tensors are those of tinygpt's own GGUF export, bit for bit (tinygpt writes
/// `output.weight` for a tied GPT-2 head too, which the converter leaves to the embedding), and
/// imported it tokenizes, scores, continues and ends a chat reply as the run does.
fn check_converted(name: &str, tolerance: f64) {
    let run = fixture(name);
    let seen = llama_cpp_said(name);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let converted = run.join("converter.gguf");
    let args = [
        "export",
        "--checkpoint",
        run.to_str().unwrap(),
        "--format",
        "gguf",
        "--out",
    ];
    ok(tinygpt(dir, &[&args[..], &["own.gguf"]].concat()));
    let read = |path: &Path| Gguf::from_bytes(&std::fs::read(path).unwrap()).unwrap();
    let (theirs, own) = (read(&converted), read(&dir.join("own.gguf")));
    let mut left_to_embedding = 0;
    for tensor in &own.tensors {
        match theirs.tensor(&tensor.name) {
            Some(t) => assert!(t == tensor, "{name}: {} differs", tensor.name),
            None => {
                // A tied head: the converter leaves it to the token embedding.
                let embedding = own.tensor("token_embd.weight").unwrap();
                assert_eq!(
                    tensor.name, "output.weight",
                    "{name}: the converter lacks it"
                );
                assert!(
                    tensor.data == embedding.data,
                    "{name}: an untied head left out"
                );
                left_to_embedding += 1;
            }
        }
    }
    assert_eq!(theirs.tensors.len() + left_to_embedding, own.tensors.len());
    let args = [
        "import",
        "--from",
        converted.to_str().unwrap(),
        "--out",
        "run",
    ];
    ok(tinygpt(dir, &args));
    compare(name, &dir.join("run"), &seen, tolerance, 0.0);
    let stops = |run: &Path| {
        let chat = Run::open(run).unwrap().config.chat;
        let mut stop = chat.stop.clone();
        stop.sort();
        (chat.template, stop)
    };
    assert_eq!(
        stops(&dir.join("run")),
        stops(&run),
        "{name}: the chat section"
    );
}

#[test]
fn llama_cpps_converter_writes_a_bpe_gpt2_as_tinygpt_does() {
    check_converted("bpe", 1e-3);
}

#[test]
fn llama_cpps_converter_writes_a_llama_as_tinygpt_does() {
    check_converted("llama", 1e-4);
}

/// A tensor as `quantised.json` records it: its ggml type and the SHA-256 of its data.
#[derive(Deserialize, PartialEq, Debug)]
struct Stored {
    r#type: String,
    sha256: String,
}

/// `tinygpt export --dtype q8_0|q5_0|q4_0 [--pure]` writes the very bytes llama.cpp's own
/// quantiser (`llama_model_quantize`, no importance matrix; its choice of type per tensor,
/// the head in Q8_0 at this width, or every matrix in the file type's type with `--pure`)
/// wrote from the run's f32 export: each tensor's type and the SHA-256 of its data
/// (`scripts/gguf-quantised-fixture.py` saved them in `llama/quantised.json`, each under the
/// arguments that follow `--dtype`).
#[test]
fn quantised_exports_are_the_bytes_llama_cpp_writes() {
    let run = fixture("llama");
    let text = std::fs::read_to_string(run.join("quantised.json")).unwrap();
    let theirs: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Stored>> =
        serde_json::from_str(&text).unwrap();
    let files = ["q8_0", "q5_0", "q4_0", "q5_0 --pure", "q4_0 --pure"];
    assert!(
        files.iter().all(|f| theirs.contains_key(*f)),
        "{:?}",
        theirs.keys()
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (dtype, tensors) in &theirs {
        let out = format!("{dtype}.gguf");
        let args = [
            "export",
            "--checkpoint",
            run.to_str().unwrap(),
            "--format",
            "gguf",
            "--dtype",
        ];
        let dtype_args: Vec<&str> = dtype.split(' ').collect();
        ok(tinygpt(
            dir,
            &[&args[..], &dtype_args, &["--out", &out]].concat(),
        ));
        let own = Gguf::from_bytes(&std::fs::read(dir.join(&out)).unwrap()).unwrap();
        assert_eq!(own.tensors.len(), tensors.len(), "{dtype}");
        let quantised = tensors.values().filter(|t| t.r#type != "F32").count();
        assert!(quantised >= 14, "{dtype}: {quantised} matrices quantised");
        for t in &own.tensors {
            let stored = Stored {
                r#type: t.kind.name().to_string(),
                sha256: format!("{:x}", Sha256::digest(&t.data)),
            };
            assert_eq!(Some(&stored), tensors.get(&t.name), "{dtype}: {}", t.name);
        }
    }
}
