//! The real `tinygpt` binary on small data: train → info → generate → eval → resume, the same
//! start on every backend, and every kind of bad input ending in one clear line.

mod bad_input;
#[path = "../common/mod.rs"]
mod common;
mod exports;
mod int8;
mod lora;
mod outputs;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::watched::Watched;
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
    // ln(71) = 4.26 at init (66 characters, 5 special tokens); 30 steps of a tiny model must
    // learn character frequencies.
    assert!((first.1 - 71f64.ln()).abs() < 0.3, "{first:?}");
    assert!(last.1 < first.1 - 0.8, "the loss did not fall: {rows:?}");

    let info = ok(tinygpt(dir, &["info", "--checkpoint", "run"]));
    assert!(info.contains("tokenizer: char, 71 tokens"), "{info}");
    assert!(
        info.contains("backend: flex (what `train --resume` continues on)"),
        "{info}"
    );
    assert!(info.contains("trained: 30 of 30 steps"), "{info}");
    assert!(info.contains("n_embd = 32"), "{info}");
    assert!(info.contains("of matrices a token ("), "{info}");
    assert!(info.contains("with --weights q8_0)"), "{info}");

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
    let args = ["train", "--resume", "--out", out, "--max-iters", "20"];
    ok(tinygpt(dir, &[&args[..], &["--backend", backend]].concat()))
}

/// `train --resume` of `out` to step 20 without `--backend`: on the backend the run was
/// trained with.
fn resume_to_20_on_its_own(dir: &Path, out: &str) -> String {
    let args = ["train", "--resume", "--out", out, "--max-iters", "20"];
    ok(tinygpt(dir, &args))
}

#[test]
fn resumed_run_equals_uninterrupted_run() {
    // Dropout on, on Burn's engine and the fused one: each micro-batch's masks come from the
    // seed, the step and its index, not from saved state. Resumed without --backend: on the
    // run's own (`auto` would take the fused engine for the flex run).
    for (backend, dropout) in [("flex", "0.1"), ("fused", "0.1")] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let dropout = format!("model.dropout={dropout}");
        let schedule = [&RESUME_SCHEDULE[..], &["--set", &dropout]].concat();
        let whole = [&["--max-iters", "20"][..], &schedule].concat();
        ok(train_on(dir, "whole", backend, &whole));
        let half = [&["--max-iters", "10"][..], &schedule].concat();
        ok(train_on(dir, "halves", backend, &half));
        let log = resume_to_20_on_its_own(dir, "halves");
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
fn every_cpu_backend_starts_from_the_same_loss() {
    let tanh = &["--set", "model.activation=\"gelu_tanh\""][..];
    let no_mlp = &["--set", "model.mlp=\"none\""][..];
    for parts in [&[][..], MODERN, LLAMA, tanh, no_mlp] {
        starts_as_flex_does(&["fused", "ndarray"], parts);
    }
}

/// Trains the same tiny run (with the settings `parts`) on flex and on each of `backends`: the
/// same step-0 losses (1e-4), and three AdamW steps later (the fused step's gradients) the same
/// losses to 1e-3. Each run's log names the engine that ran it. (wgpu beside flex: `wgpu.rs`.)
fn starts_as_flex_does(backends: &[&str], parts: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let engines = [
        ("flex", ("autodiff", "flex")),
        ("fused", ("fused", "flex")),
        ("ndarray", ("autodiff", "ndarray")),
    ];
    let mut rows = Vec::new();
    for backend in std::iter::once(&"flex").chain(backends) {
        let mut args = vec!["--max-iters", "3", "--set", "train.eval_interval=3"];
        args.extend(parts);
        let out = format!("{backend}-{}", parts.len());
        let log = ok(train_on(dir, &out, backend, &args));
        let (_, (kind, device)) = engines.iter().find(|(b, _)| b == backend).unwrap();
        let named = engine_of(&log);
        assert_eq!(
            (named.0.as_str(), named.1.as_str()),
            (*kind, *device),
            "{log}"
        );
        rows.push((*backend, metrics(&dir.join(&out))));
    }
    let (_, flex) = &rows[0];
    for (backend, rows) in &rows[1..] {
        for (at, tolerance) in [(0, 1e-4), (1, 1e-3)] {
            let (row, reference) = (rows[at], flex[at]);
            assert_eq!(row.0, reference.0);
            assert!(
                (row.1 - reference.1).abs() < tolerance,
                "{backend} {parts:?}: {row:?} vs flex {reference:?}"
            );
            assert!(
                (row.2 - reference.2).abs() < tolerance,
                "{backend} {parts:?}: {row:?} vs flex {reference:?}"
            );
        }
    }
}

/// `--backend cuda` where CUDA cannot run (a build without it, or no NVIDIA driver): every
/// command that takes a backend says why in one line, before it writes anything. Where it can
/// (known before running anything), the run trains instead.
#[test]
fn cuda_where_it_cannot_run_is_one_line_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let out = train_on(dir, "cuda", "cuda", &["--max-iters", "2"]);
    if cfg!(feature = "cuda") && std::path::Path::new("/proc/driver/nvidia/version").exists() {
        ok(out);
        return assert!(dir.join("cuda/config.toml").is_file(), "no run written");
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
/// `--max-time` saves and exits 0, pointing at the checkpoint to sample from; `--max-iters 0`
/// points at none.
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
    assert!(said.contains("sample with: tinygpt generate"), "{said}");
    // A run that trains no step writes no checkpoint, and says so instead of a command that
    // would fail.
    let none = ok(train(dir, "none", &["--max-iters", "0"]));
    assert!(!dir.join("none/last").exists());
    assert!(none.contains("no checkpoint written"), "{none}");
    assert!(!none.contains("sample with"), "{none}");
}

/// `--to-loss`: the loss it measures is `tinygpt eval`'s over the whole validation split; a
/// target the run never reaches trains to `max_iters` saying where it stood at each evaluation;
/// the first target it reaches ends the run there, saying after how many steps, seconds of
/// training and tokens; a target that is not a loss is one line. New weights are not evaluated
/// at step 0 when the target is far below a uniform guess's loss; weights from a run are.
#[test]
fn to_loss_stops_at_the_first_evaluation_under_the_target() {
    use tinygpt::run::checkpoint::{Run, Which};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let every_2 = ["--set", "train.eval_interval=2"];
    let whole_split = |out: &str| -> Vec<f64> {
        out.lines()
            .filter_map(|l| l.strip_prefix("whole-split val loss "))
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect()
    };
    let out = ok(train(
        dir,
        "far",
        &[&["--max-iters", "4", "--to-loss", "0.01"][..], &every_2].concat(),
    ));
    assert!(
        out.contains("step 0 not evaluated: new weights score about ln("),
        "{out}"
    );
    assert!(!out.contains("step 0: train loss"), "{out}");
    let losses = whole_split(&out);
    assert_eq!(losses.len(), 2, "steps 2 and 4: {out}");
    assert!(!out.contains("reached"), "{out}");
    let eval = ok(tinygpt(
        dir,
        &["eval", "--checkpoint", "far", "--which", "last"],
    ));
    let measured: f64 = eval
        .split("| loss ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{eval}"));
    assert!(
        (measured - losses[1]).abs() < 1e-3,
        "{measured} vs {losses:?}"
    );
    // Between the step-2 and the step-4 loss: reached at step 4, not before, not after.
    assert!(losses[1] < losses[0], "{losses:?}");
    let target = format!("{}", (losses[0] + losses[1]) / 2.0);
    let near = [&["--max-iters", "6", "--to-loss", &target][..], &every_2].concat();
    let out = ok(train(dir, "near", &near));
    assert!(out.contains("reached whole-split val loss"), "{out}");
    assert!(out.contains(&format!("<= {target} at step 4:")), "{out}");
    assert!(
        out.contains("s of training") && out.contains("tokens"),
        "{out}"
    );
    assert_eq!(
        Run::open(&dir.join("near"))
            .unwrap()
            .checkpoint(Which::Last, true)
            .unwrap()
            .state
            .step,
        4
    );
    // A target above a uniform guess's loss: new weights are evaluated at step 0, and reach it.
    let out = ok(train(dir, "above", &["--to-loss", "100"]));
    assert!(out.contains("<= 100 at step 0:"), "{out}");
    // Weights from a run are evaluated at step 0, however far the target.
    let from = [
        "--init-from",
        "far",
        "--max-iters",
        "2",
        "--to-loss",
        "0.01",
    ];
    let out = ok(train(dir, "from", &[&from[..], &every_2].concat()));
    assert!(!out.contains("not evaluated"), "{out}");
    assert_eq!(whole_split(&out).len(), 2, "steps 0 and 2: {out}");
    fails(
        train(dir, "bad", &["--to-loss", "0"]),
        "--to-loss must be a loss > 0",
    );
    // From ten batches an estimate has a standard error: one far above the target is not
    // followed by a pass over the whole split, which could not reach it.
    let ten = ["--set", "train.eval_iters=10"];
    let far = [
        &["--max-iters", "4", "--to-loss", "0.01"][..],
        &every_2,
        &ten,
    ]
    .concat();
    let out = ok(train(dir, "far-estimated", &far));
    let skipped = out
        .lines()
        .filter(|l| l.starts_with("whole-split val loss not measured: the estimate "))
        .count();
    assert_eq!(skipped, 1, "step 2: {out}");
    // The last step's validation loss is the whole split's, measured once.
    assert_eq!(whole_split(&out), [losses[1]], "{out}");
    assert!(out.contains("step 4: train loss "), "{out}");
    assert!(
        out.contains(&format!("val loss {:.4} (whole split)", losses[1])),
        "{out}"
    );
    // Near the target, the whole split is measured as before.
    let near = [
        &["--max-iters", "6", "--to-loss", &target][..],
        &every_2,
        &ten,
    ]
    .concat();
    let out = ok(train(dir, "near-estimated", &near));
    assert!(out.contains("at step 4:"), "{out}");
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
    let child = Watched::start_until(dir, args, until);
    child.signal(signal);
    let (code, lines, _) = child.wait();
    (code, lines)
}

/// `params` reads what `train` reads: every preset by name, a TOML file, `--set`; a file that
/// is not there is one line.
#[test]
fn params_takes_every_preset_and_a_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for (name, _) in tinygpt::config::presets::PRESETS {
        let out = ok(tinygpt(dir, &["params", "--config", name]));
        assert!(out.contains(" parameters ("), "{name}: {out}");
        assert!(out.contains("memory to train with batch"), "{name}: {out}");
    }
    let baby = ok(tinygpt(dir, &["params", "--config", "baby"]));
    assert!(baby.starts_with("4 layers, 4 heads, n_embd 128"), "{baby}");
    assert!(
        baby.contains("(0.80M without the position embedding"),
        "{baby}"
    );
    let toml = tinygpt::config::presets::preset("baby").unwrap();
    std::fs::write(dir.join("mine.toml"), toml).unwrap();
    let mine = ok(tinygpt(
        dir,
        &[
            "params",
            "--config",
            "mine.toml",
            "--set",
            "model.n_layer=2",
        ],
    ));
    assert!(mine.starts_with("2 layers, 4 heads, n_embd 128"), "{mine}");
    fails(
        tinygpt(dir, &["params", "--config", "missing.toml"]),
        "missing.toml",
    );
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
        assert!(info.contains("tokenizer: char, 71 tokens"), "{info}");
    }
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "runs/default"]));
    assert!(info.contains("max_iters = 1000"), "{info}");
}

/// Every command's `--help` ends with an example to copy, as README promises: the commands are
/// read from `tinygpt --help` itself, so a new one without examples fails here.
#[test]
fn every_command_has_help_with_an_example() {
    let tmp = tempfile::tempdir().unwrap();
    let help = ok(tinygpt(tmp.path(), &["--help"]));
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|&c| c != "help")
        .collect();
    assert!(commands.len() >= 13, "{commands:?} in:\n{help}");
    for command in commands {
        let help = ok(tinygpt(tmp.path(), &[command, "--help"]));
        assert!(
            help.contains("Example") && help.contains(&format!("tinygpt {command}")),
            "`tinygpt {command} --help` shows no example:\n{help}"
        );
    }
}

/// A part set with the older spelling trains on the fused engine (every part has its kernels)
/// and is recorded with the part's spelling.
#[test]
fn older_spellings_train_fused_and_are_recorded_as_parts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let tanh = ["--set", "model.activation=gelu_tanh", "--max-iters", "2"];
    let log = ok(train_on(dir, "tanh", "fused", &tanh));
    assert_eq!(engine_of(&log), ("fused".into(), "flex".into()), "{log}");
    assert!(!log.contains("note:"), "{log}");
    let info = ok(tinygpt(dir, &["info", "--checkpoint", "tanh"]));
    assert!(info.contains("mlp = \"gelu_tanh\""), "{info}");
}
