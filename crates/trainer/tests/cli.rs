//! The real `tinygpt` binary on small data: train → info → generate → eval → resume, the same
//! start on every backend, and every kind of bad input ending in one clear line.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;

#[test]
fn train_info_generate_eval() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let log = ok(train(
        dir,
        "run",
        &[
            "--max-iters",
            "30",
            "--set",
            "train.learning_rate=1e-2",
            "--set",
            "train.warmup_iters=5",
        ],
    ));
    assert!(log.contains("step 30: train loss"), "{log}");
    assert!(log.contains("done: step 30"), "{log}");
    let run = dir.join("run");
    for file in ["config.toml", "tokenizer.json", "metrics.csv", "loss.svg"] {
        assert!(run.join(file).is_file(), "{file} missing");
    }
    for file in [
        "best/model.safetensors",
        "best/state.json",
        "last/model.safetensors",
        "last/optimizer.bpk",
    ] {
        assert!(run.join(file).is_file(), "{file} missing");
    }
    let rows = metrics(&run);
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        [0, 5, 10, 15, 20, 25, 30]
    );
    let (first, last) = (rows[0], rows[rows.len() - 1]);
    // ln(66) = 4.19 at init; 30 steps of a tiny model must learn character frequencies.
    assert!((first.1 - 66f64.ln()).abs() < 0.3, "{first:?}");
    assert!(last.1 < first.1 - 0.8, "the loss did not fall: {rows:?}");

    let info = ok(tinygpt(dir, &["info", "--checkpoint", "run"]));
    assert!(info.contains("tokenizer: char, 66 tokens"), "{info}");
    assert!(info.contains("trained: 30 of 30 steps"), "{info}");
    assert!(info.contains("n_embd = 32"), "{info}");

    let generate_on = |seed: &str, backend: &str| {
        ok(tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                "run",
                "--prompt",
                "Of Man",
                "--max-new-tokens",
                "40",
                "--seed",
                seed,
                "--backend",
                backend,
            ],
        ))
    };
    let generate = |seed: &str| generate_on(seed, "flex");
    let text = generate("7");
    assert!(text.starts_with("Of Man"), "{text}");
    assert_eq!(
        text.trim_end_matches('\n').chars().count(),
        "Of Man".len() + 40,
        "{text:?}"
    );
    assert_eq!(text, generate("7"), "same seed, same text");
    assert_ne!(text, generate("8"), "another seed, other text");
    // The fused CPU decoder computes the same logits (to float rounding), so the same samples.
    assert_eq!(text, generate_on("7", "fused"), "fused decoder vs flex");

    let eval = ok(tinygpt(
        dir,
        &["eval", "--checkpoint", "run", "--backend", "flex"],
    ));
    // "... | 46507 tokens | loss 2.9 | 4.2 bits per character | perplexity 18.1"
    let field = |name: &str| -> f64 {
        let part = eval
            .split(" | ")
            .find(|p| p.contains(name))
            .unwrap_or_else(|| panic!("{eval}"));
        part.split_whitespace()
            .find_map(|w| w.parse::<f64>().ok())
            .unwrap()
    };
    let (loss, bits, ppl) = (
        field("loss"),
        field("bits per character"),
        field("perplexity"),
    );
    assert!(
        (bits - loss / std::f64::consts::LN_2).abs() < 1e-3,
        "{eval}"
    );
    assert!((ppl - loss.exp()).abs() / ppl < 1e-3, "{eval}");
    assert!(
        (loss - rows.iter().map(|r| r.2).fold(f64::MAX, f64::min)).abs() < 0.15,
        "{eval} vs {rows:?}"
    );
    assert!(eval.contains("validation split"), "{eval}");
}

/// For runs stopped at step 10 and resumed to 20: the schedule must not depend on max_iters
/// for the two halves to match the whole.
const RESUME_SCHEDULE: [&str; 4] = [
    "--set",
    "train.lr_decay_iters=20",
    "--set",
    "train.eval_interval=10",
];

/// `train --resume` of the run `out` up to step 20 on `backend`; returns its log.
fn resume_to_20(dir: &Path, out: &str, backend: &str) -> String {
    ok(tinygpt(
        dir,
        &[
            "train",
            "--resume",
            "--out",
            out,
            "--max-iters",
            "20",
            "--backend",
            backend,
        ],
    ))
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    // The fused step with dropout on: its masks come from (seed, step), not from saved state.
    for (backend, dropout) in [("flex", "0.0"), ("fused", "0.1")] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let dropout = format!("model.dropout={dropout}");
        let schedule = [&RESUME_SCHEDULE[..], &["--set", &dropout]].concat();
        let whole = [&["--max-iters", "20"][..], &schedule].concat();
        ok(train_on(dir, "whole", backend, &whole));
        let half = [&["--max-iters", "10"][..], &schedule].concat();
        ok(train_on(dir, "halves", backend, &half));
        let log = resume_to_20(dir, "halves", backend);
        assert!(log.contains("resuming at step 10 of 20"), "{log}");
        let (whole, halves) = (dir.join("whole"), dir.join("halves"));
        assert_eq!(metrics(&whole), metrics(&halves), "{backend}");
        // Bit for bit. (Compared as values: the files' metadata order is not deterministic.)
        assert!(
            weights(&whole) == weights(&halves),
            "{backend}: weights differ after resuming"
        );
    }
}

/// The fused step keeps AdamW's moments in its own buffers and saves them in Burn's format:
/// a fused run resumed on flex follows the uninterrupted fused run to float rounding (the two
/// compute gradients in different orders), and vice versa.
#[test]
fn runs_resume_across_the_fused_and_autodiff_engines() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let schedule = RESUME_SCHEDULE;
    let whole = [&["--max-iters", "20"][..], &schedule].concat();
    ok(train_on(dir, "whole", "fused", &whole));
    let half = [&["--max-iters", "10"][..], &schedule].concat();
    for (first, then) in [("fused", "flex"), ("flex", "fused")] {
        let out = format!("{first}-then-{then}");
        ok(train_on(dir, &out, first, &half));
        resume_to_20(dir, &out, then);
        let (want, got) = (metrics(&dir.join("whole")), metrics(&dir.join(&out)));
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert!(
                (w.1 - g.1).abs() < 1e-4 && (w.2 - g.2).abs() < 1e-4,
                "{out}: {w:?} vs {g:?}"
            );
        }
    }
}

#[test]
fn every_backend_starts_from_the_same_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut losses = Vec::new();
    for backend in ["flex", "fused", "ndarray", "wgpu"] {
        let corpus = corpus();
        let mut args = vec![
            "train",
            "--data",
            corpus.to_str().unwrap(),
            "--out",
            backend,
            "--backend",
            backend,
        ];
        args.extend(TINY);
        args.extend(["--max-iters", "3", "--set", "train.eval_interval=3"]);
        let out = tinygpt(dir, &args);
        if skip_without_wgpu(backend, &out) {
            continue;
        }
        ok(out);
        let rows = metrics(&dir.join(backend));
        if backend != "flex" {
            // Three AdamW steps later, the fused step's gradients (and on wgpu, the AdamW that
            // runs on the device) have moved the weights as Burn's did.
            let (row, flex) = (rows[1], metrics(&dir.join("flex"))[1]);
            assert_eq!(row.0, 3);
            assert!(
                (row.1 - flex.1).abs() < 1e-3,
                "{backend}: {row:?} vs flex {flex:?}"
            );
            assert!(
                (row.2 - flex.2).abs() < 1e-3,
                "{backend}: {row:?} vs flex {flex:?}"
            );
        }
        losses.push((backend, rows[0]));
    }
    let (_, reference) = losses[0];
    for (backend, row) in &losses {
        assert_eq!(row.0, 0);
        assert!(
            (row.1 - reference.1).abs() < 1e-4,
            "{backend}: {row:?} vs flex {reference:?}"
        );
        assert!(
            (row.2 - reference.2).abs() < 1e-4,
            "{backend}: {row:?} vs flex {reference:?}"
        );
    }
}

/// `--backend cuda` where CUDA cannot run (a build without it, or no NVIDIA driver): every
/// command that takes a backend says why in one line, before it writes anything.
#[test]
fn cuda_where_it_cannot_run_is_one_line_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = train_on(dir, "cuda", "cuda", &["--max-iters", "2"]);
    if cfg!(feature = "cuda") && out.status.success() {
        eprintln!("this machine runs CUDA: nothing to refuse");
        return;
    }
    let why = match cfg!(feature = "cuda") {
        true => "--backend cuda: no NVIDIA driver on this machine",
        false => {
            "--backend cuda: this tinygpt was built without CUDA; rebuild with --features cuda"
        }
    };
    fails(out, why);
    assert!(
        !dir.join("cuda").exists(),
        "a refused run left its directory"
    );
    ok(train_on(dir, "run", "fused", &["--max-iters", "2"]));
    let run = ["--checkpoint", "run", "--backend", "cuda"];
    for command in [
        &["generate"][..],
        &["eval"],
        &["attention", "--prompt", "Of Man"],
        &["serve", "--port", "0"],
    ] {
        fails(tinygpt(dir, &[command, &run[..]].concat()), why);
    }
    fails(
        tinygpt(
            dir,
            &[
                "bench",
                "--config",
                "baby",
                "--backend",
                "cuda",
                "--iters",
                "1",
            ],
        ),
        why,
    );
}

/// `--max-time` ends a run as asked: it saves, says so, and exits 0 (Ctrl-C exits 130).
#[test]
fn max_time_saves_and_exits_zero() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = train(
        dir,
        "run",
        &["--max-time", "2s", "--max-iters", "100000000"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(said.contains("time limit reached at step"), "{said}");
    assert!(dir.join("run/last").is_dir());
}

#[test]
fn ctrl_c_saves_and_resume_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let corpus = corpus();
    let mut args = vec![
        "train",
        "--data",
        corpus.to_str().unwrap(),
        "--out",
        "run",
        "--backend",
        "flex",
    ];
    args.extend(TINY);
    args.extend(["--max-iters", "1000000", "--set", "train.log_interval=1"]);
    // Wait until it is training, then interrupt: SIGTERM (as `docker stop` or a scheduler
    // sends) saves as Ctrl-C does.
    let until = |line: &str| line.starts_with("step 3/");
    for signal in ["TERM", "INT"] {
        let _ = std::fs::remove_dir_all(dir.join("run"));
        let (code, lines) = interrupt_when(dir, &args, signal, until);
        assert_eq!(code, Some(130), "SIG{signal}: {lines:?}");
        assert!(
            lines.iter().any(|l| l.starts_with("interrupted at step")),
            "SIG{signal}: {lines:?}"
        );
    }
    let state = std::fs::read_to_string(dir.join("run/last/state.json")).unwrap();
    let step: usize = state
        .split("\"step\":")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap();
    assert!(step >= 3, "{state}");
    let log = ok(tinygpt(
        dir,
        &[
            "train",
            "--resume",
            "--out",
            "run",
            "--max-iters",
            &(step + 2).to_string(),
            "--backend",
            "flex",
        ],
    ));
    assert!(log.contains(&format!("resuming at step {step}")), "{log}");
    assert!(log.contains(&format!("done: step {}", step + 2)), "{log}");
}

/// `tinygpt args` started in `dir` and sent `signal` (`INT`, as Ctrl-C does, or `TERM`) once
/// it prints a line for which `until` holds: the exit code and every line printed.
fn interrupt_when(
    dir: &Path,
    args: &[&str],
    signal: &str,
    until: impl Fn(&str) -> bool,
) -> (Option<i32>, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tinygpt"))
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let done = until(&line);
        seen.push(line);
        if done {
            break;
        }
    }
    let kill = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    seen.extend(lines.map(Result::unwrap));
    (child.wait().unwrap().code(), seen)
}

/// Outside the repository the binary needs nothing beside it: `train` with no arguments and
/// `train --config baby` find their config and corpus built in.
#[test]
fn works_from_any_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(!dir.starts_with(manifest_dir().join("../..").canonicalize().unwrap()));
    let out = tinygpt(dir, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("Usage: tinygpt"), "{}", stderr(&out));
    for (args, run) in [
        (&["train"][..], "runs/default"),
        (&["train", "--config", "baby"][..], "runs/baby"),
    ] {
        let (code, lines) = interrupt_when(dir, args, "INT", |line| line.starts_with("step 0:"));
        assert_eq!(code, Some(130), "{args:?}: {lines:?}");
        assert!(
            lines[0].contains("corpus builtin:paradise-lost.txt (")
                && lines[0].contains(&format!("run {run}")),
            "{lines:?}"
        );
        let info = ok(tinygpt(dir, &["info", "--checkpoint", run]));
        assert!(
            info.contains("path = \"builtin:paradise-lost.txt\""),
            "{info}"
        );
        assert!(info.contains("tokenizer: char, 66 tokens"), "{info}");
    }
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "runs/default"]));
    assert!(info.contains("max_iters = 1000"), "{info}");
}

/// A model the fused engine does not implement (same shapes, another activation): an explicit
/// `--backend fused` refuses it in one line before writing anything; `auto` on a machine without
/// a GPU trains it on flex and says so.
#[test]
fn the_fused_engine_runs_only_what_it_implements() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let refusal = "the fused CPU engine does not implement `activation = \"gelu_tanh\"`";
    let tanh = ["--set", "model.activation=gelu_tanh", "--max-iters", "2"];
    fails(train_on(dir, "refused", "fused", &tanh), refusal);
    assert!(!dir.join("refused").exists());
    let log = ok(train_on(dir, "fallback", "auto", &tanh));
    // Without a physical GPU, `auto` means the fused engine, which cannot take this model.
    if log.contains("Device<Flex") {
        assert!(log.contains(&format!("note: {refusal}")), "{log}");
        assert!(log.contains("training on flex"), "{log}");
    }
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "fallback"]));
    assert!(info.contains("activation = \"gelu_tanh\""), "{info}");
}

#[test]
fn bad_corpus_is_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let run = |data: &str| {
        let mut args = vec!["train", "--data", data, "--out", "run", "--backend", "flex"];
        args.extend(TINY);
        tinygpt(dir, &args)
    };
    fails(run("missing.txt"), "cannot read corpus missing.txt");
    std::fs::write(dir.join("empty.txt"), "  \n").unwrap();
    fails(run("empty.txt"), "corpus empty.txt is empty");
    std::fs::write(dir.join("latin1.txt"), b"caf\xe9 au lait").unwrap();
    fails(
        run("latin1.txt"),
        "corpus latin1.txt is not UTF-8 text: invalid UTF-8 at byte 3",
    );
    std::fs::write(dir.join("short.txt"), "to be or not").unwrap();
    fails(run("short.txt"), "corpus too short");
    assert!(
        !dir.join("run").exists(),
        "a failed start must not create the run directory"
    );
}

#[test]
fn bad_config_names_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let with = |set: &str| train(dir, "run", &["--set", set]);
    fails(with("train.learning_ratee=1"), "learning_ratee");
    fails(with("model.n_head=3"), "n_head");
    fails(with("train.beta2=1.5"), "train.beta2");
    fails(with("data.tokenizer=words"), "tokenizer = \"words\"");
    std::fs::write(dir.join("bad.toml"), "[train]\nbatch_size = -4\n").unwrap();
    fails(
        tinygpt(
            dir,
            &[
                "train",
                "--config",
                "bad.toml",
                "--data",
                corpus().to_str().unwrap(),
            ],
        ),
        "batch_size = -4",
    );
    fails(
        tinygpt(dir, &["train", "--config", "nope.toml"]),
        "cannot read config nope.toml",
    );
    // An unknown backend is a usage error from the argument parser.
    let out = tinygpt(dir, &["train", "--backend", "tpu"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("invalid value 'tpu'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_checkpoints_and_prompts_are_errors_and_nothing_is_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "5"]));
    let run = dir.join("run");
    let snapshot = |run: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        for sub in ["", "best", "last"] {
            for entry in std::fs::read_dir(run.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    files.push((path.clone(), std::fs::read(&path).unwrap()));
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&run);

    // An existing run directory is refused without --resume.
    fails(
        train(dir, "run", &["--max-iters", "5"]),
        "already holds a run",
    );
    assert!(
        snapshot(&run) == before,
        "a refused run changed the checkpoint"
    );

    let sample = |ckpt: &str, prompt: &str| {
        tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                ckpt,
                "--prompt",
                prompt,
                "--max-new-tokens",
                "5",
                "--backend",
                "flex",
            ],
        )
    };
    fails(
        sample("run", "Zebra ✓"),
        "character '✓' (position 6) never occurs in the training corpus",
    );
    fails(sample("nowhere", "Of"), "checkpoint nowhere does not exist");

    // A corrupt weights file, in a copy of the run.
    let copy = |name: &str| {
        let to = dir.join(name);
        for (path, bytes) in &before {
            let rel = path.strip_prefix(&run).unwrap();
            std::fs::create_dir_all(to.join(rel).parent().unwrap()).unwrap();
            std::fs::write(to.join(rel), bytes).unwrap();
        }
        to
    };
    let corrupt = copy("corrupt");
    let weights = corrupt.join("best/model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    fails(
        sample("corrupt", "Of"),
        "best/model.safetensors is damaged: its checksum does not match",
    );

    // Weights of another architecture: the config says 64 wide, the weights are 32.
    let other = copy("other");
    let config = std::fs::read_to_string(other.join("config.toml")).unwrap();
    std::fs::write(
        other.join("config.toml"),
        config.replace("n_embd = 32", "n_embd = 64"),
    )
    .unwrap();
    fails(
        sample("other", "Of"),
        "do not fit this run's model: Shape mismatch",
    );

    // A truncated config or tokenizer.
    let broken = copy("broken");
    std::fs::write(broken.join("tokenizer.json"), "{\"kind\": \"char\"").unwrap();
    fails(sample("broken", "Of"), "tokenizer.json is invalid");
    fails(
        tinygpt(dir, &["eval", "--checkpoint", "broken"]),
        "tokenizer.json is invalid",
    );
    fails(
        tinygpt(dir, &["info", "--checkpoint", "nowhere"]),
        "does not exist",
    );

    assert!(
        snapshot(&run) == before,
        "failed commands changed the checkpoint"
    );
}

#[test]
fn documents_batching_and_bpe_train() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Stanzas separated by blank lines: each is a document, padded in the batch.
    let text = std::fs::read_to_string(corpus()).unwrap();
    let docs: String = text
        .lines()
        .take(2000)
        .collect::<Vec<_>>()
        .chunks(4)
        .map(|c| c.join("\n"))
        .collect::<Vec<_>>()
        .join("\n\n");
    std::fs::write(dir.join("stanzas.txt"), docs).unwrap();
    let mut args = vec![
        "train",
        "--data",
        "stanzas.txt",
        "--out",
        "docs",
        "--backend",
        "flex",
        "--max-iters",
        "10",
    ];
    args.extend(TINY);
    args.extend([
        "--set",
        "data.batching=documents",
        "--set",
        "data.tokenizer=bpe",
        "--set",
        "data.bpe_vocab_size=300",
    ]);
    let log = ok(tinygpt(dir, &args));
    assert!(
        log.contains("bpe (byte-level) tokenizer, vocab 300"),
        "{log}"
    );
    let rows = metrics(&dir.join("docs"));
    assert!(
        rows.iter().all(|r| r.1.is_finite() && r.2.is_finite()),
        "{rows:?}"
    );
    // Byte-level BPE encodes characters it never saw, so any prompt works.
    let out = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "docs",
            "--prompt",
            "Zebra ✓",
            "--max-new-tokens",
            "5",
            "--backend",
            "flex",
        ],
    ));
    assert!(out.starts_with("Zebra ✓"), "{out}");
    let eval = ok(tinygpt(
        dir,
        &["eval", "--checkpoint", "docs", "--backend", "flex"],
    ));
    assert!(eval.contains("bits per byte"), "{eval}");
}

/// The matrices `tinygpt attention` printed: (layer, head, rows of numbers).
fn printed_matrices(out: &str) -> Vec<(String, Vec<Vec<f64>>)> {
    let mut matrices = Vec::new();
    let mut lines = out.lines().peekable();
    while let Some(line) = lines.next() {
        if !line.starts_with("layer ") {
            continue;
        }
        lines.next(); // column labels
        let mut rows = Vec::new();
        while let Some(row) = lines.peek() {
            let numbers: Vec<f64> = row
                .split_whitespace()
                .skip(1)
                .filter_map(|w| w.parse().ok())
                .collect();
            if numbers.is_empty() {
                break;
            }
            rows.push(numbers);
            lines.next();
        }
        matrices.push((line.to_string(), rows));
    }
    matrices
}

#[test]
fn attention_maps_of_a_trained_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "10"]));
    let out = ok(tinygpt(
        dir,
        &[
            "attention",
            "--checkpoint",
            "run",
            "--prompt",
            "Of Man",
            "--decimals",
            "4",
            "--backend",
            "flex",
        ],
    ));
    let matrices = printed_matrices(&out);
    assert_eq!(matrices.len(), 2, "1 layer x 2 heads:\n{out}");
    for (title, rows) in &matrices {
        assert_eq!(rows.len(), 6, "{title}:\n{out}");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.len(), 6, "{title}:\n{out}");
            let sum: f64 = row.iter().sum();
            assert!((sum - 1.0).abs() < 6e-4, "{title} row {i} sums to {sum}");
            assert!(
                row[i + 1..].iter().all(|&w| w == 0.0),
                "{title} row {i} sees the future: {row:?}"
            );
        }
        // Row 0 can only attend to itself.
        assert_eq!(rows[0][0], 1.0);
    }
    assert!(
        out.contains("     O      f      ␣      M      a      n"),
        "token labels:\n{out}"
    );
    for file in [
        "attention.svg",
        "attention-L0-H0.svg",
        "attention-L0-H1.svg",
    ] {
        let svg = std::fs::read_to_string(dir.join("run/attention").join(file)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{file}");
    }
    let one = ok(tinygpt(
        dir,
        &[
            "attention",
            "--checkpoint",
            "run",
            "--prompt",
            "Of",
            "--head",
            "1",
            "--backend",
            "flex",
        ],
    ));
    assert_eq!(printed_matrices(&one).len(), 1);
    fails(
        tinygpt(
            dir,
            &[
                "attention",
                "--checkpoint",
                "run",
                "--prompt",
                "Of",
                "--layer",
                "3",
            ],
        ),
        "--layer 3 does not exist",
    );
    let long = "a".repeat(17);
    fails(
        tinygpt(
            dir,
            &["attention", "--checkpoint", "run", "--prompt", &long],
        ),
        "17 tokens but the model's block_size is 16",
    );
}

#[test]
fn export_import_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "10"]));
    ok(tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            "run",
            "--format",
            "nanogpt",
            "--out",
            "a.safetensors",
        ],
    ));
    let bytes = std::fs::read(dir.join("a.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let shape = |name: &str| file.tensor(name).unwrap().shape().to_vec();
    assert_eq!(shape("transformer.wte.weight"), [66, 32]);
    assert_eq!(shape("transformer.wpe.weight"), [16, 32]);
    assert_eq!(shape("transformer.h.0.attn.c_attn.weight"), [96, 32]);
    assert_eq!(shape("transformer.h.0.attn.c_attn.bias"), [96]);
    assert_eq!(shape("transformer.h.0.mlp.c_fc.weight"), [128, 32]);
    assert_eq!(shape("transformer.h.0.mlp.c_proj.weight"), [32, 128]);
    assert_eq!(shape("transformer.h.0.ln_1.weight"), [32]);
    assert_eq!(shape("transformer.ln_f.bias"), [32]);
    assert_eq!(shape("lm_head.weight"), [66, 32]);
    assert_eq!(file.len(), 2 + 12 + 2 + 1);
    let sidecar = std::fs::read_to_string(dir.join("a.json")).unwrap();
    assert!(
        sidecar.contains("\"n_embd\": 32")
            && sidecar.contains("\"stoi\"")
            && sidecar.contains("\"itos\""),
        "{sidecar}"
    );

    ok(tinygpt(
        dir,
        &["import", "--from", "a.safetensors", "--out", "imported"],
    ));
    ok(tinygpt(
        dir,
        &[
            "export",
            "--checkpoint",
            "imported",
            "--out",
            "b.safetensors",
        ],
    ));
    assert!(
        std::fs::read(dir.join("b.safetensors")).unwrap() == bytes,
        "export → import → export changed bytes"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("b.json")).unwrap(),
        sidecar
    );
    let greedy = |run: &str| {
        ok(tinygpt(
            dir,
            &[
                "generate",
                "--checkpoint",
                run,
                "--prompt",
                "Of Man",
                "--temperature",
                "0",
                "--max-new-tokens",
                "30",
                "--backend",
                "flex",
            ],
        ))
    };
    assert_eq!(greedy("imported"), greedy("run"));

    // Broken files: each error names the tensor or the problem.
    type Tensors = Vec<(String, Vec<usize>, Vec<u8>)>;
    let write_variant = |name: &str, edit: &dyn Fn(&mut Tensors)| {
        let mut tensors: Tensors = file
            .tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
            .collect();
        edit(&mut tensors);
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, s, d)| {
                let dtype = if d.len() == s.iter().product::<usize>() * 2 {
                    safetensors::Dtype::F16
                } else {
                    safetensors::Dtype::F32
                };
                (
                    n.clone(),
                    safetensors::tensor::TensorView::new(dtype, s.clone(), d).unwrap(),
                )
            })
            .collect();
        std::fs::write(
            dir.join(format!("{name}.safetensors")),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
        std::fs::write(dir.join(format!("{name}.json")), &sidecar).unwrap();
    };
    write_variant("missing", &|t| {
        t.retain(|(n, _, _)| n != "transformer.h.0.ln_2.bias")
    });
    fails(
        tinygpt(
            dir,
            &["import", "--from", "missing.safetensors", "--out", "x"],
        ),
        "tensor `transformer.h.0.ln_2.bias` is missing",
    );
    write_variant("shape", &|t| {
        let e = t
            .iter_mut()
            .find(|(n, _, _)| n == "transformer.h.0.attn.c_proj.weight")
            .unwrap();
        e.1 = vec![16, 64];
    });
    fails(
        tinygpt(
            dir,
            &["import", "--from", "shape.safetensors", "--out", "x"],
        ),
        "tensor `transformer.h.0.attn.c_proj.weight` has shape [16, 64], expected [32, 32]",
    );
    write_variant("dtype", &|t| {
        let e = t
            .iter_mut()
            .find(|(n, _, _)| n == "transformer.ln_f.weight")
            .unwrap();
        e.2.truncate(e.2.len() / 2);
    });
    // Half-precision weights are widened to f32.
    ok(tinygpt(
        dir,
        &["import", "--from", "dtype.safetensors", "--out", "f16"],
    ));
    std::fs::write(dir.join("cut.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    std::fs::write(dir.join("cut.json"), &sidecar).unwrap();
    fails(
        tinygpt(dir, &["import", "--from", "cut.safetensors", "--out", "x"]),
        "cut.safetensors is not a valid safetensors file",
    );
    fails(
        tinygpt(
            dir,
            &["import", "--from", "nothing.safetensors", "--out", "x"],
        ),
        "nothing.safetensors does not exist",
    );
    assert!(
        !dir.join("x").exists(),
        "a failed import must not leave a run behind"
    );
    fails(
        tinygpt(dir, &["import", "--from", "a.safetensors", "--out", "run"]),
        "already holds a run",
    );
}

/// PyTorch (`../shared/bench/torch_gpt.py logits`) on tinygpt's exported weights gives the
/// logits tinygpt computes. Needs a Python with torch, so it is reported as ignored unless asked
/// for (`cargo test --release -- --ignored`); asked for without one, it fails saying why.
#[test]
#[ignore = "needs Python with torch + safetensors (TINYGPT_PYTHON): cargo test --release -- --ignored"]
fn pytorch_reads_exported_weights_needs_python() {
    let script = manifest_dir().join("../../../shared/bench/torch_gpt.py");
    let python = std::env::var("TINYGPT_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python)
        .args(["-c", "import torch, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        script.exists() && has_torch,
        "needs {} and `{python}` with torch + safetensors (set TINYGPT_PYTHON)",
        script.display()
    );
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(train(dir, "run", &["--max-iters", "20"]));
    ok(tinygpt(
        dir,
        &["export", "--checkpoint", "run", "--out", "m.safetensors"],
    ));
    let tokens = "14,53,1,38,40,52,5,57,1,44,47,56,57,58";
    let ours = ok(tinygpt(
        dir,
        &[
            "logits",
            "--checkpoint",
            "run",
            "--tokens",
            tokens,
            "--backend",
            "flex",
        ],
    ));
    let theirs = Command::new(&python)
        .arg(&script)
        .args([
            "logits",
            "--weights",
            "m.safetensors",
            "--n-layer",
            "1",
            "--n-head",
            "2",
            "--n-embd",
            "32",
            "--block-size",
            "16",
            "--vocab",
            "66",
            "--tokens",
            tokens,
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    let theirs = ok(theirs);
    let parse = |json: &str| -> Vec<f64> {
        let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        let rows = value["logits"].as_array().unwrap();
        rows.iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()))
            .collect()
    };
    let (a, b) = (parse(&ours), parse(&theirs));
    assert_eq!(a.len(), 14 * 66);
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
    let max_rel = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0f64, f64::max);
    eprintln!("max relative error of tinygpt vs PyTorch logits: {max_rel:.2e}");
    assert!(max_rel < 1e-4, "{max_rel}");
}

/// A run keeps a journal for watching it learn: a line per logged step in `steps.csv`, and per
/// evaluation a sample and the attention of the fixed prompt in `evals.jsonl`; `loss.svg`
/// draws both. A prompt the tokenizer cannot write is a one-line error.
#[test]
fn a_run_journals_its_steps_and_evaluations() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let args = ["--max-iters", "20", "--set", "train.log_interval=5"];
    ok(train(dir, "run", &args));
    let steps = std::fs::read_to_string(dir.join("run/steps.csv")).unwrap();
    let lines: Vec<&str> = steps.lines().collect();
    assert_eq!(
        lines[0],
        "step,loss,lr,grad_norm,tokens_per_s,skipped_steps,elapsed_s"
    );
    let logged: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split(',').next().unwrap())
        .collect();
    assert_eq!(logged, ["5", "10", "15", "20"], "{steps}");
    let evals: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("run/evals.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let at: Vec<u64> = evals.iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(at, [0, 5, 10, 15, 20]);
    for eval in &evals {
        // TINY: block_size 16 (the prompt), 1 layer of 2 heads, 8 sampled tokens.
        assert_eq!(eval["prompt"].as_array().unwrap().len(), 16);
        assert_eq!(
            eval["sample"].as_str().unwrap().chars().count(),
            8,
            "{eval}"
        );
        let heads = eval["attention"][0].as_array().unwrap();
        assert_eq!(
            (eval["attention"].as_array().unwrap().len(), heads.len()),
            (1, 2)
        );
        for head in heads {
            let w: Vec<u64> = head
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(w.len(), 16 * 16);
            for q in 0..16 {
                let row = &w[q * 16..(q + 1) * 16];
                assert!(row[q + 1..].iter().all(|&v| v == 0), "the future is masked");
                let sum: u64 = row[..=q].iter().sum();
                assert!(
                    sum.abs_diff(255) <= 1 + q as u64,
                    "row {q} sums to {sum}/255"
                );
            }
        }
    }
    let plot = std::fs::read_to_string(dir.join("run/loss.svg")).unwrap();
    assert!(plot.contains("best val") && plot.contains("learning rate"));
    fails(
        train(dir, "other", &["--set", "train.sample_prompt=\"§\""]),
        "`train.sample_prompt` cannot be written with this run's tokenizer",
    );
    assert!(
        !dir.join("other").exists(),
        "a refused run leaves no directory"
    );
}
