//! `tinygpt export --format gguf`: a trained run written as llama.cpp's `gpt2` or `llama`
//! architecture in f32, f16 and q8_0, read back by tinygpt's reader and by llama.cpp's own Python reader
//! (`gguf`, in the client Python), whose quantizer the q8_0 blocks equal bit for bit.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use half::f16;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tinygpt::interop::gguf::{Gguf, TensorType, Value, quant};

/// GPT-2's parts that llama.cpp computes exactly (GELU with tanh), no biases (written as
/// zeros), a tied head (written twice), and rows of 48: not a multiple of 32, so q8_0 keeps
/// those matrices f16 and quantizes only `ffn_down` (rows of 192).
const EXPORTABLE: [&str; 6] = [
    "--set",
    "model.mlp=\"gelu_tanh\"",
    "--set",
    "model.bias=false",
    "--set",
    "model.n_embd=48",
];

fn trained(dir: &Path, extra: &[&str]) -> PathBuf {
    ok(train_on(
        dir,
        "run",
        "fused",
        &[&["--max-iters", "3"], extra].concat(),
    ));
    dir.join("run")
}

fn export(dir: &Path, format: &str, dtype: Option<&str>, out: &str) -> std::process::Output {
    let mut args = vec![
        "export",
        "--checkpoint",
        "run",
        "--which",
        "last",
        "--format",
        format,
        "--out",
        out,
    ];
    if let Some(dtype) = dtype {
        args.extend(["--dtype", dtype]);
    }
    tinygpt(dir, &args)
}

fn read(path: &Path) -> Gguf {
    Gguf::from_bytes(&std::fs::read(path).unwrap()).unwrap()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    quant::decode(bytes, TensorType::F32).unwrap()
}

/// The nanoGPT export's tensors (row-major `[out, in]`) under llama.cpp's names.
fn reference(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    ok(export(dir, "nanogpt", None, "ref.safetensors"));
    let bytes = std::fs::read(dir.join("ref.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rename = |n: &str| {
        let n = n.replace("transformer.h.", "blk.");
        let pairs = [
            ("transformer.wte", "token_embd"),
            ("transformer.wpe", "position_embd"),
            ("transformer.ln_f", "output_norm"),
            ("lm_head", "output"),
            ("ln_1", "attn_norm"),
            ("attn.c_attn", "attn_qkv"),
            ("attn.c_proj", "attn_output"),
            ("ln_2", "ffn_norm"),
            ("mlp.c_fc", "ffn_up"),
            ("mlp.c_proj", "ffn_down"),
        ];
        pairs.iter().fold(n, |n, (a, b)| n.replace(a, b))
    };
    file.tensors()
        .into_iter()
        .map(|(name, view)| (rename(&name), floats(view.data())))
        .collect()
}

#[test]
fn a_run_exports_as_llama_cpps_gpt2() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &EXPORTABLE);
    let reference = reference(dir);
    for dtype in ["f32", "f16", "q8_0"] {
        let log = ok(export(dir, "gguf", Some(dtype), &format!("{dtype}.gguf")));
        assert!(log.contains("llama.cpp's gpt2"), "{log}");
    }
    let f32_file = read(&dir.join("f32.gguf"));
    let get = |key: &str| f32_file.get(key).unwrap_or_else(|| panic!("no {key}"));
    assert_eq!(get("general.architecture").as_str(), Some("gpt2"));
    for (key, want) in [
        ("gpt2.block_count", 1),
        ("gpt2.embedding_length", 48),
        ("gpt2.feed_forward_length", 192),
        ("gpt2.attention.head_count", 2),
        ("gpt2.context_length", 16),
        ("general.file_type", 0),
    ] {
        assert_eq!(get(key).as_u64(), Some(want), "{key}");
    }
    // The tokenizer: one token per embedding row, tinygpt's special tokens as control tokens.
    let rows = reference["token_embd.weight"].len() / 48;
    let tokens = get("tokenizer.ggml.tokens").as_array().unwrap();
    let types = get("tokenizer.ggml.token_type").as_array().unwrap();
    assert_eq!((tokens.len(), types.len()), (rows, rows));
    let eos = get("tokenizer.ggml.eos_token_id").as_u64().unwrap() as usize;
    assert_eq!(tokens[eos].as_str(), Some("<|endoftext|>"));
    assert_eq!(types[eos], Value::I32(3));
    assert_eq!(
        tokens[0].as_str(),
        Some("Ċ"),
        "the newline in GPT-2's byte alphabet"
    );
    // Every tensor llama.cpp's gpt2 loads, the f32 ones equal to the nanoGPT export's.
    assert_eq!(f32_file.tensors.len(), 17);
    for t in &f32_file.tensors {
        let values = floats(&t.data);
        match reference.get(&t.name) {
            Some(want) => assert_eq!(&values, want, "{}", t.name),
            None => assert!(values.iter().all(|&v| v == 0.0), "{} is a bias", t.name),
        }
    }
    assert_eq!(
        f32_file.tensor("output.weight").unwrap().data,
        f32_file.tensor("token_embd.weight").unwrap().data
    );
    assert_eq!(
        f32_file.tensor("blk.0.attn_qkv.weight").unwrap().ne,
        [48, 144]
    );
    for (dtype, file_type) in [("f16", 1), ("q8_0", 7)] {
        let file = read(&dir.join(format!("{dtype}.gguf")));
        assert_eq!(
            file.get("general.file_type").unwrap().as_u64(),
            Some(file_type)
        );
        for (t, exact) in file.tensors.iter().zip(&f32_file.tensors) {
            check_stored(t.kind, dtype, &t.ne, &t.data, &floats(&exact.data), &t.name);
        }
    }
}

/// Llama's parts with one key/value head of two, as llama.cpp's `llama`: the tensors of the
/// Hugging Face export under llama.cpp's names, queries and keys with each head's rows
/// interleaved (row `i` of half `h` at `2i + h`: llama.cpp rotates neighbours, tinygpt the
/// halves), and the heads and rotary settings in the metadata.
#[test]
fn a_llama_shaped_run_exports_as_llama_cpps_llama() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let theta = ["--set", "model.rope_theta=5000"];
    trained(dir, &[LLAMA, &theta].concat());
    let log = ok(export(dir, "gguf", None, "m.gguf"));
    assert!(log.contains("llama.cpp's llama"), "{log}");
    ok(export(dir, "hf", None, "hf"));
    let bytes = std::fs::read(dir.join("hf/model.safetensors")).unwrap();
    let hf = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let file = read(&dir.join("m.gguf"));
    let get = |key: &str| file.get(key).unwrap_or_else(|| panic!("no {key}"));
    assert_eq!(get("general.architecture").as_str(), Some("llama"));
    for (key, want) in [
        ("llama.attention.head_count", 2),
        ("llama.attention.head_count_kv", 1),
        ("llama.rope.dimension_count", 16),
        ("llama.embedding_length", 32),
        ("llama.context_length", 16),
    ] {
        assert_eq!(get(key).as_u64(), Some(want), "{key}");
    }
    assert_eq!(get("llama.rope.freq_base"), &Value::F32(5000.0));
    // Tied: no `output.weight`, llama.cpp reads the embedding for it.
    assert!(file.tensor("output.weight").is_none());
    let names = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        (
            "model.layers.0.input_layernorm.weight",
            "blk.0.attn_norm.weight",
        ),
        (
            "model.layers.0.post_attention_layernorm.weight",
            "blk.0.ffn_norm.weight",
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            "blk.0.attn_q.weight",
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            "blk.0.attn_k.weight",
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            "blk.0.attn_v.weight",
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            "blk.0.attn_output.weight",
        ),
        (
            "model.layers.0.mlp.gate_proj.weight",
            "blk.0.ffn_gate.weight",
        ),
        ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight"),
        (
            "model.layers.0.mlp.down_proj.weight",
            "blk.0.ffn_down.weight",
        ),
    ];
    assert_eq!(file.tensors.len(), names.len());
    for (theirs, ours) in names {
        let want = floats(hf.tensor(theirs).unwrap().data());
        let got = floats(&file.tensor(ours).unwrap().data);
        let rotary = ours.ends_with("attn_q.weight") || ours.ends_with("attn_k.weight");
        if !rotary {
            assert_eq!(got, want, "{ours}");
            continue;
        }
        // 32 values a row, heads of 16 rows.
        for (row, values) in got.chunks(32).enumerate() {
            let (head, at) = (row / 16, row % 16);
            let from = head * 16 + (at % 2) * 8 + at / 2;
            assert_eq!(values, &want[from * 32..from * 32 + 32], "{ours} row {row}");
        }
        assert_ne!(got, want, "{ours} is reordered");
    }
}

/// A tensor stored as `kind` under `--dtype dtype` holds `exact` as that storage rounds it.
fn check_stored(kind: TensorType, dtype: &str, ne: &[u64], data: &[u8], exact: &[f32], name: &str) {
    // llama.cpp's quantiser never quantises a position table: f32 beside q8_0 matrices.
    let want = match (ne.len(), dtype, ne[0] % 32) {
        (1, _, _) => TensorType::F32,
        (_, "q8_0", _) if name == "position_embd.weight" => TensorType::F32,
        (_, "q8_0", 0) => TensorType::Q8_0,
        _ => TensorType::F16,
    };
    assert_eq!(kind, want, "{name} {ne:?}");
    let values = quant::decode(data, kind).unwrap();
    match kind {
        TensorType::F32 => assert_eq!(values, exact, "{name}"),
        TensorType::F16 => {
            for (v, x) in values.iter().zip(exact) {
                assert_eq!(*v, f16::from_f32(*x).to_f32(), "{name}");
            }
        }
        _ => {
            for (block, (v, x)) in data.chunks(34).zip(values.chunks(32).zip(exact.chunks(32))) {
                // Half a step, and up to 127 steps of the scale's own f16 rounding (2^-11).
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let bound = d * (0.5 + 127.0 / 2048.0) * (1.0 + 1e-3);
                for (v, x) in v.iter().zip(x) {
                    assert!((v - x).abs() <= bound, "{name}: {v} vs {x} (scale {d})");
                }
            }
        }
    }
}

fn check_script(args: &[&str], dir: &Path) -> Vec<Json> {
    let script = manifest_dir().join("tests/gguf_check.py");
    let out = Command::new(client_python())
        .arg(script)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
#[cfg_attr(
    no_client_python,
    ignore = "no Python with gguf (set TINYGPT_CLIENTS_PYTHON, then rebuild)"
)]
fn llama_cpps_reader_reads_the_exports_as_tinygpts_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &EXPORTABLE);
    let files = ["f32.gguf", "f16.gguf", "q8_0.gguf"];
    for (file, dtype) in files.iter().zip(["f32", "f16", "q8_0"]) {
        ok(export(dir, "gguf", Some(dtype), file));
    }
    for (seen, file) in check_script(&files, dir).iter().zip(files) {
        let mine = read(&dir.join(file));
        let meta = seen["metadata"].as_object().unwrap();
        assert_eq!(meta.len(), mine.metadata.len(), "{file}: {meta:?}");
        for (key, value) in &mine.metadata {
            let theirs = &meta[key];
            match value {
                Value::Array(items) => assert_eq!(theirs["len"], items.len(), "{key}"),
                Value::Str(s) => assert_eq!(theirs, s.as_str(), "{key}"),
                Value::Bool(b) => assert_eq!(theirs, *b, "{key}"),
                Value::F32(v) => assert_eq!(theirs.as_f64(), Some(f64::from(*v)), "{key}"),
                other => assert_eq!(theirs.as_u64(), other.as_u64(), "{key}"),
            }
        }
        let tensors = seen["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), mine.tensors.len());
        for (theirs, t) in tensors.iter().zip(&mine.tensors) {
            assert_eq!(theirs["name"], t.name.as_str());
            assert_eq!(theirs["type"], t.kind.name(), "{}", t.name);
            let ne: Vec<u64> = serde_json::from_value(theirs["ne"].clone()).unwrap();
            assert_eq!(ne, t.ne, "{}", t.name);
            let sha = format!("{:x}", Sha256::digest(&t.data));
            assert_eq!(theirs["sha256"], sha, "{}", t.name);
        }
    }
    // f16 and q8_0 exactly as gguf-py's quantizer (ggml's reference, bit for bit) writes them.
    let stored = |file: &str| {
        let file = read(&dir.join(file));
        file.tensors
            .iter()
            .filter(|t| t.kind != TensorType::F32)
            .count()
    };
    let verdict = &check_script(&["--requantize", files[0], files[1], files[2]], dir)[0];
    assert_eq!(verdict["differ"], Json::Array(vec![]), "{verdict}");
    assert_eq!(
        verdict["checked"],
        stored(files[1]) + stored(files[2]),
        "{verdict}"
    );
    assert!(stored(files[2]) > 0);
}

#[test]
fn what_gguf_cannot_hold_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &[]);
    fails(
        export(dir, "nanogpt", Some("q8_0"), "m.safetensors"),
        "--dtype goes with --format gguf",
    );
    assert!(!dir.join("m.safetensors").exists());
    let pure = [
        "export",
        "--checkpoint",
        "run",
        "--format",
        "gguf",
        "--pure",
        "--out",
        "m.gguf",
    ];
    fails(tinygpt(dir, &pure), "--pure goes with --dtype");
    assert!(!dir.join("m.gguf").exists());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, &EXPORTABLE);
    std::fs::write(dir.join("m.gguf"), b"mine").unwrap();
    fails(export(dir, "gguf", Some("q8_0"), "m.gguf"), "exists");
    assert_eq!(std::fs::read(dir.join("m.gguf")).unwrap(), b"mine");
    // The `modern` preset's parts: rotary, so what llama.cpp's `llama` lacks is named.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(dir, MODERN);
    let hint = "--set model.mlp=\"swiglu\" --set model.logit_softcap=0";
    fails(export(dir, "gguf", None, "m.gguf"), hint);
    assert!(!dir.join("m.gguf").exists());
    // The settings it names export, as qwen3 (QK-norm kept); with biases too they do not.
    for (extra, expected) in [
        (&[][..], "llama.cpp's qwen3"),
        (&["--set", "model.bias=true"][..], "--set model.bias=false"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let hinted = [
            "--set",
            "model.mlp=\"swiglu\"",
            "--set",
            "model.logit_softcap=0",
        ];
        trained(dir, &[MODERN, &hinted, extra].concat());
        let out = export(dir, "gguf", None, "m.gguf");
        match extra.is_empty() {
            true => assert!(ok(out).contains(expected)),
            false => fails(out, expected),
        }
    }
    // Its ReLU² without the soft-cap: as arcee once QK-norm is off, and without biases.
    let no_cap = ["--set", "model.logit_softcap=0"];
    let no_qk_norm = ["--set", "model.qk_norm=false"];
    let biases = ["--set", "model.bias=true"];
    let cases: [(&[&str], &str); 3] = [
        (&no_cap, "--set model.qk_norm=false"),
        (
            &[&no_cap[..], &no_qk_norm, &biases].concat(),
            "--set model.bias=false",
        ),
        (&[&no_cap[..], &no_qk_norm].concat(), "llama.cpp's arcee"),
    ];
    for (extra, expected) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        trained(dir, &[MODERN, extra].concat());
        let out = export(dir, "gguf", None, "m.gguf");
        match expected.starts_with("llama.cpp") {
            true => assert!(ok(out).contains(expected)),
            false => {
                fails(out, expected);
                assert!(!dir.join("m.gguf").exists());
            }
        }
    }
}

/// The figures of an export's report: `(tokens, largest logit difference, loss here, loss in
/// the file)`.
fn report_figures(report: &str) -> (usize, f64, f64, f64) {
    let line = report
        .lines()
        .find(|l| l.starts_with("the file computes"))
        .unwrap_or_else(|| panic!("no report in {report}"));
    let number = |after: &str| -> f64 {
        let rest = &line[line
            .find(after)
            .unwrap_or_else(|| panic!("{after:?} in {line}"))
            + after.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || ".e-".contains(c)))
            .unwrap_or(rest.len());
        rest[..end].parse().unwrap()
    };
    (
        number(": on ") as usize,
        number("at most "),
        number("loss "),
        number("here, "),
    )
}

/// tinygpt's default MLP is exact GELU (erf), which llama.cpp's `gpt2` computes with tanh's
/// approximation only: the export writes it and reports what that changes on the run's
/// validation text, and `eval` agrees: the run's loss is the report's "here", the file
/// imported back scores the report's "in the file" (f32; with `--weights q8_0` for a q8_0 file).
#[test]
fn an_exact_gelu_exports_with_tanh_and_its_report_agrees_with_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A validation split under the report's sample: it measures all of it, as eval does.
    trained(dir, &["--set", "data.val_fraction=0.01"]);
    let run = tinygpt::run::checkpoint::Run::open(&dir.join("run")).unwrap();
    let val = tinygpt::data::corpus::for_run(&run.dir, &run.config, &run.tokenizer, false)
        .unwrap()
        .val;
    let tinygpt::data::Split::Packed(tokens) = val else {
        panic!("a packed split")
    };
    let text = run
        .tokenizer
        .decode(&tokens.slice(0, tokens.len()))
        .unwrap();
    std::fs::write(dir.join("val.txt"), text).unwrap();
    let here = eval_loss(&ok(tinygpt(
        dir,
        &[
            "eval",
            "--checkpoint",
            "run",
            "--which",
            "last",
            "--backend",
            "flex",
        ],
    )));
    // The file's model in f32 (GELU with tanh: what llama.cpp's gpt2 computes), imported back.
    ok(export(dir, "gguf", None, "m.gguf"));
    ok(tinygpt(
        dir,
        &["import", "--from", "m.gguf", "--out", "imported"],
    ));
    for dtype in ["f32", "q8_0"] {
        let file = format!("m-{dtype}.gguf");
        let report = ok(export(dir, "gguf", Some(dtype), &file));
        assert!(
            report.contains("GELU with tanh's approximation"),
            "{report}"
        );
        let (tokens_seen, worst, reported_here, in_file) = report_figures(&report);
        assert_eq!(tokens_seen, tokens.len() - 1, "{report}");
        assert!(worst > 0.0 && worst < 0.1, "{report}");
        assert!(
            (reported_here - here).abs() <= 2e-4,
            "{report} vs eval's {here}"
        );
        // q8_0 as `eval --weights q8_0` scores it: the fused decoder's int8 blocks.
        let backend = if dtype == "q8_0" { "fused" } else { "flex" };
        let args = [
            "eval",
            "--checkpoint",
            "imported",
            "--data",
            "val.txt",
            "--weights",
            dtype,
            "--backend",
            backend,
        ];
        let file_loss = eval_loss(&ok(tinygpt(dir, &args)));
        assert!(
            (in_file - file_loss).abs() <= 2e-4,
            "{report} vs eval's {file_loss}"
        );
    }
}

/// A gain-less RMSNorm (the `modern` preset's) is Llama's RMSNorm with gains of one: a
/// Llama-shaped run with it exports with every norm's gains 1, and the file imports back to the
/// run's logits.
#[test]
fn a_gain_less_rms_norm_exports_as_gains_of_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    trained(
        dir,
        &[LLAMA, &["--set", "model.norm=\"rms_unit\""]].concat(),
    );
    ok(export(dir, "gguf", None, "m.gguf"));
    let file = read(&dir.join("m.gguf"));
    let norms: Vec<_> = file
        .tensors
        .iter()
        .filter(|t| t.name.ends_with("norm.weight"))
        .collect();
    assert_eq!(norms.len(), 3, "two per block and the final one");
    for t in norms {
        assert_eq!(floats(&t.data), vec![1.0; 32], "{}", t.name);
    }
    ok(tinygpt(
        dir,
        &["import", "--from", "m.gguf", "--out", "back"],
    ));
    let logits = |run: &str, which: &str| {
        let args = [
            "logits",
            "--checkpoint",
            run,
            "--which",
            which,
            "--tokens",
            "3,1,4,1,5",
        ];
        let out = ok(tinygpt(dir, &args));
        let value: Json = serde_json::from_str(out.trim()).unwrap();
        serde_json::from_value::<Vec<Vec<f32>>>(value["logits"].clone()).unwrap()
    };
    let (ours, back) = (logits("run", "last"), logits("back", "best"));
    for (a, b) in ours.iter().flatten().zip(back.iter().flatten()) {
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{a} vs {b}");
    }
}
