//! Helpers shared by the integration tests: the real binary, a tiny model, run files.
#![allow(dead_code)] // Each test file uses its own share of them.

pub mod kept;
pub mod server;
pub mod watched;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A model small enough that a few steps take well under a second.
pub const TINY: [&str; 16] = [
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_head=2",
    "--set",
    "model.n_embd=32",
    "--set",
    "model.block_size=16",
    "--set",
    "train.batch_size=4",
    "--set",
    "train.eval_iters=2",
    "--set",
    "train.eval_interval=5",
    "--set",
    "train.sample_tokens=8",
];

/// This crate's directory, read when the test runs: a binary built in another checkout that
/// shares the target directory would carry that checkout's path in `env!`.
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(
        std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo test sets CARGO_MANIFEST_DIR"),
    )
}

/// The Python with `tests/clients/requirements.txt` (the client libraries, llama.cpp's `gguf`)
/// that the build found (`crates/test-needs.rs`). The tests that use it are ignored on a machine
/// without one (never under CI), so reaching here without one is a failure.
pub fn client_python() -> String {
    match env!("TINYGPT_TEST_CLIENT_PYTHON") {
        "" => panic!(
            "no Python with openai, langchain_openai and gguf when the tests were built (set \
             TINYGPT_CLIENTS_PYTHON to a Python with tests/clients/requirements.txt installed, \
             then rebuild)"
        ),
        python => python.to_string(),
    }
}

pub fn corpus() -> PathBuf {
    manifest_dir().join("../../data/paradise-lost.txt")
}

/// `tinygpt args` to run in `dir`, not started yet.
pub fn command<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: &[S]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tinygpt"));
    command
        .args(args)
        .current_dir(dir)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir());
    command
}

/// Runs `tinygpt args` in `dir`.
pub fn tinygpt(dir: &Path, args: &[&str]) -> Output {
    command(dir, args).output().expect("the binary runs")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// A failed run: non-zero exit, one line on stderr containing `expected`, no panic.
pub fn fails(out: Output, expected: &str) {
    let err = stderr(&out);
    assert!(!out.status.success(), "should fail: {}", stdout(&out));
    assert_ne!(out.status.code(), Some(101), "panicked: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected:\n{err}"
    );
    assert!(err.starts_with("tinygpt: error: "), "{err}");
    assert!(err.contains(expected), "expected {expected:?} in: {err}");
}

/// The engine and backend a run's log names in its fixed form, `engine: KIND on BACKEND`
/// (`("fused", "flex")`, `("device", "wgpu")`, ...); a log without that line fails the test.
pub fn engine_of(log: &str) -> (String, String) {
    let line = log
        .lines()
        .find_map(|l| l.strip_prefix("engine: "))
        .unwrap_or_else(|| panic!("no `engine: KIND on BACKEND` line in:\n{log}"));
    let (kind, backend) = line
        .split_once(" on ")
        .unwrap_or_else(|| panic!("not `KIND on BACKEND`: {line}"));
    (kind.to_string(), backend.to_string())
}

pub fn train(dir: &Path, out: &str, extra: &[&str]) -> Output {
    train_on(dir, out, "flex", extra)
}

pub fn train_on(dir: &Path, out: &str, backend: &str, extra: &[&str]) -> Output {
    let corpus = corpus();
    let mut args = vec![
        "train",
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        out,
        "--backend",
        backend,
    ];
    args.extend(TINY);
    args.extend(extra);
    tinygpt(dir, &args)
}

/// A run's `last` weights: (name, values) in name order.
pub fn weights(run: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(run.join("last/model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<f32>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view
                .data()
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name, values)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// `metrics.csv` rows as (step, train loss, val loss).
pub fn metrics(run: &Path) -> Vec<(usize, f64, f64)> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// `tinygpt logits` of `run` for `tokens`, on `backend`: `[tokens, vocab]`.
pub fn logits(dir: &Path, run: &str, tokens: &[u32], backend: &str) -> Vec<Vec<f64>> {
    let list: Vec<String> = tokens.iter().map(u32::to_string).collect();
    let args = [
        "logits",
        "--checkpoint",
        run,
        "--tokens",
        &list.join(","),
        "--backend",
        backend,
    ];
    let out = ok(tinygpt(dir, &args));
    let value: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    serde_json::from_value(value["logits"].clone()).unwrap()
}

/// The log-softmax rows `tinygpt logits` prints for `ids`.
pub fn log_softmax_rows(dir: &Path, ids: &[u32]) -> Vec<Vec<f64>> {
    let rows = logits(dir, "run", ids, "fused");
    rows.into_iter()
        .map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let log_z = max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
            row.iter().map(|l| l - log_z).collect()
        })
        .collect()
}

/// Checks that `logprobs` (one per token of `text` after the first) average to minus the loss
/// `tinygpt eval --data` reports on `text` with the run `dir/run` (2e-4: eval prints four
/// decimals), over as many tokens.
pub fn assert_scores_match_eval(dir: &Path, text: &str, logprobs: &[f64]) {
    std::fs::write(dir.join("scored.txt"), text).unwrap();
    let eval = ok(tinygpt(
        dir,
        &[
            "eval",
            "--checkpoint",
            "run",
            "--data",
            "scored.txt",
            "--backend",
            "fused",
        ],
    ));
    let loss: f64 = eval
        .split("| loss ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no loss in {eval}"));
    assert!(
        eval.contains(&format!("| {} tokens |", logprobs.len())),
        "{eval}"
    );
    let mean = -logprobs.iter().sum::<f64>() / logprobs.len() as f64;
    assert!((mean - loss).abs() < 2e-4, "scores {mean} vs eval {loss}");
}

/// The `modern` preset's parts (nanochat's), as settings.
pub const MODERN: &[&str] = &[
    "--set",
    "model.position=\"rope\"",
    "--set",
    "model.norm=\"rms_unit\"",
    "--set",
    "model.qk_norm=true",
    "--set",
    "model.mlp=\"relu2\"",
    "--set",
    "model.bias=false",
    "--set",
    "model.tie_embeddings=false",
    "--set",
    "model.logit_softcap=15",
    "--set",
    "model.proj_init=\"zero\"",
];

/// Llama's parts: rotary positions, RMSNorm with gain, SwiGLU, one key/value head.
pub const LLAMA: &[&str] = &[
    "--set",
    "model.position=\"rope\"",
    "--set",
    "model.norm=\"rms\"",
    "--set",
    "model.mlp=\"swiglu\"",
    "--set",
    "model.n_kv_head=1",
    "--set",
    "model.bias=false",
];

/// Words of 3 to 7 letters from a fixed generator (the same on every machine).
pub fn words(seed: u64, n: usize) -> Vec<String> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    (0..n)
        .map(|_| {
            let len = 3 + next() % 5;
            (0..len)
                .map(|_| (b'a' + (next() % 26) as u8) as char)
                .collect()
        })
        .collect()
}

/// Two runs in `dir`: `base`, a `modern` model trained briefly on the built-in corpus, and
/// `chat`, it fine-tuned on 3,000 conversations (`shout.jsonl`) asking to "shout" a word,
/// answered with the word in capitals. Returns five words in none of the conversations.
pub fn shout_runs(dir: &Path) -> Vec<String> {
    let lines: Vec<String> = words(7, 3000)
        .iter()
        .map(|w| {
            serde_json::json!({"messages": [
                {"role": "user", "content": format!("shout {w}")},
                {"role": "assistant", "content": w.to_uppercase()}]})
            .to_string()
        })
        .collect();
    std::fs::write(dir.join("shout.jsonl"), lines.join("\n")).unwrap();
    let quick = [
        "--backend",
        "fused",
        "--set",
        "train.eval_iters=2",
        "--set",
        "train.sample_tokens=0",
    ];
    // Rotary positions (the `modern` parts): copying a word letter by letter is what they do
    // well.
    let base = [
        "train",
        "--config",
        "modern",
        "--out",
        "base",
        "--max-iters",
        "10",
    ];
    ok(tinygpt(dir, &[&base[..], &quick].concat()));
    let tune = [
        "train",
        "--config",
        "modern",
        "--init-from",
        "base",
        "--data",
        "shout.jsonl",
        "--out",
        "chat",
        "--max-iters",
        "400",
        "--set",
        "train.batch_size=32",
        "--set",
        "train.warmup_iters=20",
        "--set",
        "train.lr_decay_iters=400",
        "--set",
        "train.eval_interval=400",
    ];
    let log = ok(tinygpt(dir, &[&tune[..], &quick].concat()));
    assert!(log.contains("2700 train / 300 val conversations"), "{log}");
    words(99, 40)
        .into_iter()
        .filter(|w| !lines.iter().any(|l| l.contains(&format!("shout {w}\""))))
        .take(5)
        .collect()
}

/// The loss in `tinygpt eval`'s output line (`… | loss 2.1234 | …`).
pub fn eval_loss(out: &str) -> f64 {
    let at = out
        .find("| loss ")
        .unwrap_or_else(|| panic!("no loss in {out}"))
        + 7;
    out[at..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
