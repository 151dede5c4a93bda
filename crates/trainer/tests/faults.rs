//! Trust under faults, through the real binary: `kill -9` at random moments, two writers, a
//! full disk, damaged checkpoint files, runs that diverge, runs too big for the machine, and
//! output piped into a reader that goes away. Each ends in a clear line and loses nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::watched::Watched;
use common::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A fused run on the tiny model, checkpointing every 2 steps.
fn fused(extra: &[&str]) -> Vec<String> {
    let corpus = corpus();
    let mut args: Vec<String> = ["train", "--data", corpus.to_str().unwrap(), "--backend"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push("fused".into());
    args.extend(TINY.iter().map(|s| s.to_string()));
    args.extend(["--set", "train.eval_interval=2", "--set", "train.threads=1"].map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn spawn(dir: &Path, args: &[String]) -> std::process::Child {
    command(dir, args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs")
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The `last` step `info` reports for `run`.
fn last_step(dir: &Path, run: &str) -> usize {
    let info = ok(tinygpt(dir, &["info", "--checkpoint", run]));
    let line = info
        .lines()
        .find(|l| l.starts_with("checkpoints:"))
        .unwrap_or_else(|| panic!("{info}"));
    let last = line
        .split("| last step ")
        .nth(1)
        .unwrap_or_else(|| panic!("{line}"));
    assert!(last.contains("checksums verified"), "{line}");
    last.split(',').next().unwrap().trim().parse().unwrap()
}

/// `TINYGPT_KILL_ROUNDS=N` for a longer soak (default 24).
#[test]
fn kill_9_at_random_moments_loses_nothing_and_resumes_bit_equal() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rounds: usize = std::env::var("TINYGPT_KILL_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    // A limit the killed run cannot reach during the rounds, also on a fast machine with nothing
    // else running (a tiny model here trains ~500 steps a second, checkpointing every other
    // step; the rounds sleep 210 ms on average). The schedule decays over that many steps
    // whatever `--max-iters` says, so the run can end wherever the rounds left it, and the
    // uninterrupted run is trained afterwards to the same step only.
    let limit = (200 * rounds).to_string();
    let schedule = format!("train.lr_decay_iters={limit}");
    let mut rng = StdRng::seed_from_u64(20261122);
    let mut killed = 0;
    for round in 0..rounds {
        let run = dir.join("killed");
        let args = if run.join("config.toml").exists() {
            [
                "train",
                "--resume",
                "--out",
                "killed",
                "--max-iters",
                &limit,
            ]
            .map(String::from)
            .to_vec()
        } else {
            fused(&["--out", "killed", "--max-iters", &limit, "--set", &schedule])
        };
        let mut child = spawn(dir, &args);
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            killed += 1;
        }
        let status = child.wait().unwrap();
        assert_ne!(status.code(), Some(101), "round {round}: panicked");
        // Whatever the moment, the run is readable (or was never created).
        if run.join("config.toml").exists() {
            let info = ok(tinygpt(dir, &["info", "--checkpoint", "killed"]));
            assert!(!info.contains("DAMAGED"), "round {round}: {info}");
        }
    }
    assert!(
        killed >= rounds * 5 / 6,
        "only {killed} of {rounds} rounds were killed mid-run"
    );
    // A few steps past the last checkpoint the rounds left, so the resumed run also trains.
    let total = last_step(dir, "killed") + 10;
    let steps = &total.to_string();
    ok(tinygpt(
        dir,
        &["train", "--resume", "--out", "killed", "--max-iters", steps],
    ));
    assert_eq!(last_step(dir, "killed"), total);
    ok(tinygpt(
        dir,
        &as_strs(&fused(&[
            "--out",
            "whole",
            "--max-iters",
            steps,
            "--set",
            &schedule,
        ])),
    ));
    eprintln!("{killed} of {rounds} rounds killed mid-run, resumed to step {total}");
    assert!(
        weights(&dir.join("whole")) == weights(&dir.join("killed")),
        "weights after {killed} kills differ from the uninterrupted run's"
    );
    // The journal too: every logged step and evaluation once, as the uninterrupted run's.
    let journal = |run: &str| {
        let steps = std::fs::read_to_string(dir.join(run).join("steps.csv")).unwrap();
        let steps: Vec<String> = steps
            .lines()
            .map(|l| l.split(',').take(2).collect::<Vec<_>>().join(","))
            .collect();
        let evals: Vec<serde_json::Value> =
            std::fs::read_to_string(dir.join(run).join("evals.jsonl"))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        (steps, evals)
    };
    let (whole, resumed) = (journal("whole"), journal("killed"));
    assert_eq!(whole.0, resumed.0, "steps.csv (step, loss)");
    assert_eq!(whole.1, resumed.1, "evals.jsonl");
}

#[test]
fn two_writers_exactly_one_wins_and_the_loser_names_the_winner() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let every_step = ["--set", "train.log_interval=1"];
    let first_run = [&["--out", "run", "--max-iters", "4"][..], &every_step].concat();
    ok(tinygpt(dir, &as_strs(&fused(&first_run))));
    // A long resume holds the run once it has taken a step (its lock is taken before); a second
    // writer starts then.
    let resume = ["train", "--resume", "--out", "run", "--max-iters", "100000"];
    let first = Watched::start_until(dir, &resume, |l| l.starts_with("step 5/"));
    let pid = first.pid();
    let second = tinygpt(
        dir,
        &["train", "--resume", "--out", "run", "--max-iters", "8"],
    );
    fails(second, &format!("run run is in use by process {pid}"));
    first.signal("INT");
    let (code, lines, err) = first.wait();
    assert_eq!(
        code,
        Some(130),
        "the first writer ends by Ctrl-C: {lines:?}\n{err}"
    );
    assert!(last_step(dir, "run") > 4);

    // Two new runs into one directory at once: one creates it, the other is refused.
    let racers: Vec<_> = (0..2)
        .map(|_| spawn(dir, &fused(&["--out", "race", "--max-iters", "2"])))
        .collect();
    let outcomes: Vec<_> = racers
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let winners = outcomes.iter().filter(|o| o.status.success()).count();
    assert_eq!(winners, 1, "{outcomes:?}");
    let loser = outcomes.into_iter().find(|o| !o.status.success()).unwrap();
    let err = stderr(&loser);
    assert!(
        err.contains("already holds a run") || err.contains("is in use by process"),
        "{err}"
    );
    assert_eq!(last_step(dir, "race"), 2);
}

#[test]
fn a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tinygpt(
        dir,
        &as_strs(&fused(&["--out", "run", "--max-iters", "4"])),
    ));
    let weights_size = std::fs::metadata(dir.join("run/last/model.safetensors"))
        .unwrap()
        .len();
    // Files may grow to 1 KiB less than the weights: the next checkpoint cannot be written.
    // SIGXFSZ ignored, so the write fails with EFBIG instead of killing the process.
    let limit_kib = weights_size / 1024 - 1;
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f {limit_kib}; exec \"$0\" \"$@\""
        ))
        .arg(env!("CARGO_BIN_EXE_tinygpt"))
        .args(["train", "--resume", "--out", "run", "--max-iters", "8"])
        .current_dir(dir)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .unwrap();
    fails(out, "File too large");
    assert!(
        !dir.join("run/.last.tmp").exists(),
        "the partial save is cleaned up"
    );
    assert_eq!(last_step(dir, "run"), 4);
    ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "run",
            "--which",
            "last",
            "--max-new-tokens",
            "5",
        ],
    ));
    ok(tinygpt(
        dir,
        &["train", "--resume", "--out", "run", "--max-iters", "8"],
    ));
    assert_eq!(last_step(dir, "run"), 8);
}

/// Ways to damage a file: a flipped byte, the second half cut off, a zeroed stretch.
fn damage(path: &Path, how: usize, rng: &mut StdRng) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = rng.random_range(0..bytes.len());
    match how {
        0 => bytes[at] ^= 1 << rng.random_range(0..8),
        1 => bytes.truncate(bytes.len() / 2),
        _ => {
            let end = (at + 64).min(bytes.len());
            // A stretch that is zero already would change nothing: make sure one byte moves.
            bytes[at..end].fill(0);
            if bytes == std::fs::read(path).unwrap() {
                bytes[at] = 0xff;
            }
        }
    }
    std::fs::write(path, bytes).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

#[test]
fn every_damaged_checkpoint_file_is_named_and_last_falls_back_to_prev() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tinygpt(
        dir,
        &as_strs(&fused(&["--out", "run", "--max-iters", "6"])),
    ));
    assert!(dir.join("run/prev/state.json").is_file());
    let mut rng = StdRng::seed_from_u64(7);
    let files = [
        "best/model.safetensors",
        "best/state.json",
        "last/model.safetensors",
        "last/state.json",
        "last/optimizer.bpk",
    ];
    let mut tries = 0;
    for file in files {
        for how in 0..3 {
            let copy: PathBuf = dir.join(format!("damaged-{tries}"));
            let name = copy.file_name().unwrap().to_str().unwrap().to_string();
            copy_dir(&dir.join("run"), &copy);
            damage(&copy.join(file), how, &mut rng);
            tries += 1;
            let damaged = format!("{name}/{file} is damaged");
            let info = ok(tinygpt(dir, &["info", "--checkpoint", &name]));
            assert!(info.contains(&damaged), "{file}, damage {how}: {info}");
            if file.starts_with("best/") {
                let out = tinygpt(dir, &["generate", "--checkpoint", &name]);
                fails(out, &damaged);
                continue;
            }
            // `last` falls back to `prev`: sampling with a warning, resuming from it.
            let which = if file.ends_with("optimizer.bpk") {
                vec!["train", "--resume", "--out", &name, "--max-iters", "8"]
            } else {
                vec!["generate", "--checkpoint", &name, "--which", "last"]
            };
            let out = tinygpt(dir, &which);
            let err = stderr(&out);
            assert!(out.status.success(), "{file}, damage {how}: {err}");
            assert!(err.contains(&format!("warning: {damaged}")), "{err}");
            assert!(err.contains(&format!("{name}/prev (step 4)")), "{err}");
        }
    }
    assert_eq!(tries, 15);
}

#[test]
fn a_diverging_run_skips_non_finite_steps_then_stops_keeping_its_checkpoint() {
    diverge("fused", 1);
}

/// On a GPU the guard decides on the device, and the flags are read with the loss, every
/// `log_interval` steps (3 here): the same lines, the same stop at the same step, nothing saved.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn on_wgpu_the_guard_reads_its_flags_at_log_intervals_with_the_same_result() {
    diverge("wgpu", 3);
}

/// A run saved at step 4, then resumed on `backend` with an absurd learning rate: every step
/// after the first has a non-finite loss, is skipped, and the fifth in a row stops the run.
/// The four steps before run on the fused engine whatever `backend` is (a checkpoint resumes
/// on any backend): on wgpu each process compiles its kernels again, half a minute on
/// lavapipe, and the guard under test is the resumed run's.
fn diverge(backend: &str, log_interval: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tinygpt(
        dir,
        &as_strs(&fused(&["--out", "run", "--max-iters", "4"])),
    ));
    let before = weights(&dir.join("run"));
    // An absurd learning rate, as if the config had been edited: the first update blows the
    // weights up, every step after it has a non-finite loss.
    let config = dir.join("run/config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let edited: String = text
        .lines()
        .map(|l| match l.starts_with("learning_rate") {
            true => "learning_rate = 1e30".to_string(),
            false => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&config, edited).unwrap();
    // No loss estimate before the guard stops it: those refuse a non-finite estimate at once.
    let log_interval = format!("train.log_interval={log_interval}");
    let out = tinygpt(
        dir,
        &[
            "train",
            "--resume",
            "--out",
            "run",
            "--backend",
            backend,
            "--max-iters",
            "40",
            "--set",
            "train.eval_interval=100",
            "--set",
            &log_interval,
        ],
    );
    let log = stdout(&out);
    // Step 5 blew the weights up; steps 6 to 9 are skipped and said, each under its number.
    for k in 1..=4 {
        let said = format!("not finite, update skipped ({k} in a row)");
        let line = log.lines().find(|l| l.ends_with(&said));
        let line = line.unwrap_or_else(|| panic!("no {said:?} in:\n{log}"));
        assert!(
            line.starts_with(&format!("step {}: loss ", 5 + k)),
            "{line}"
        );
    }
    assert!(!log.contains("(5 in a row)"), "{log}");
    fails(
        out,
        "training stopped at step 10: 5 steps in a row had a non-finite loss or gradient norm",
    );
    // The checkpoint is the one saved at step 4, untouched.
    assert_eq!(last_step(dir, "run"), 4);
    assert!(weights(&dir.join("run")) == before);
    ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "run",
            "--which",
            "last",
            "--max-new-tokens",
            "5",
        ],
    ));
}

#[test]
fn a_run_too_big_for_the_machine_is_refused_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for _ in 0..2 {
        let out = train(
            dir,
            "big",
            &["--set", "model.n_embd=65536", "--set", "model.n_head=1"],
        );
        // Refused by the estimate (Linux), never by the allocator.
        fails(out, "this run needs about");
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

#[test]
fn a_reader_that_goes_away_ends_output_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(tinygpt(
        dir,
        &as_strs(&fused(&["--out", "run", "--max-iters", "2"])),
    ));
    for args in [
        &["info", "--checkpoint", "run"][..],
        &[
            "generate",
            "--checkpoint",
            "run",
            "--max-new-tokens",
            "2000",
        ],
        &["attention", "--checkpoint", "run", "--prompt", "Of Man"],
        &["params", "--config", "shakespeare-char"],
    ] {
        let mut child = command(dir, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // `| head -0`: the reader is gone before the first line.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}
