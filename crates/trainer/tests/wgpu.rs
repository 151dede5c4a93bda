//! Training on wgpu (lavapipe on CI) beside flex, in one process: the library's `Trainer`, as
//! the binary drives it. A wgpu process spends most of its first minute compiling kernels
//! (lavapipe builds each pipeline with LLVM), so these checks share one process and compile
//! each kernel once; the binary's `--backend wgpu` itself is run by `precision.rs` and
//! `faults.rs`.

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::*;
use tinygpt::backend::Backend;
use tinygpt::train::{Limits, TrainOptions, Trainer};

/// `--set KEY=VALUE` pairs as the overrides they stand for.
fn overrides(pairs: &[&str]) -> Vec<String> {
    assert!(pairs.len().is_multiple_of(2) && pairs.iter().step_by(2).all(|f| *f == "--set"));
    pairs
        .iter()
        .skip(1)
        .step_by(2)
        .map(|s| s.to_string())
        .collect()
}

/// Trains the tiny model (`TINY`, then `extra`) into `dir/out` to `max_iters` steps, or
/// resumes it there; returns the `engine: KIND on BACKEND` of its start line.
fn train(
    dir: &Path,
    out: &str,
    backend: Backend,
    max_iters: usize,
    extra: &[&str],
    resume: bool,
) -> (String, String) {
    let mut settings = overrides(&TINY);
    settings.push(format!("data.path={:?}", corpus().display().to_string()));
    settings.push(format!("train.max_iters={max_iters}"));
    settings.extend(overrides(extra));
    let options = TrainOptions {
        config: None,
        overrides: if resume {
            vec![format!("train.max_iters={max_iters}")]
        } else {
            settings
        },
        out: Some(dir.join(out)),
        backend,
        resume,
        init_from: None,
        ranks: None,
    };
    let mut trainer = Trainer::open(&options).unwrap_or_else(|e| panic!("{out}: {e:#}"));
    let start = trainer.describe().unwrap();
    let stop = AtomicBool::new(false);
    let limits = Limits {
        stop: &stop,
        max_time: None,
        to_loss: None,
    };
    let outcome = trainer
        .run(limits)
        .unwrap_or_else(|e| panic!("{out}: {e:#}"));
    assert!(!outcome.interrupted);
    engine_of(&start)
}

/// The same tiny run (default parts, the `modern` preset's with a bigram table, Llama's) on
/// flex and on wgpu:
/// the same step-0 losses (1e-4), and three AdamW steps later (on wgpu, the AdamW kernel that
/// runs on the device) the same losses to 1e-3.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn wgpu_starts_from_flexs_loss() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // `modern`'s parts with a bigram table: its rows gathered and its gradient scattered on
    // the device as on flex.
    let modern = [MODERN, &["--set", "model.bigram=true"]].concat();
    for (name, parts) in [("gpt2", &[][..]), ("modern", &modern), ("llama", LLAMA)] {
        let step = ["--set", "train.eval_interval=3"];
        let extra = [parts, &step].concat();
        let flex = train(
            dir,
            &format!("flex-{name}"),
            Backend::Flex,
            3,
            &extra,
            false,
        );
        assert_eq!(flex, ("autodiff".into(), "flex".into()));
        let wgpu = train(
            dir,
            &format!("wgpu-{name}"),
            Backend::Wgpu,
            3,
            &extra,
            false,
        );
        assert_eq!(wgpu, ("device".into(), "wgpu".into()));
        let (flex, wgpu) = (
            metrics(&dir.join(format!("flex-{name}"))),
            metrics(&dir.join(format!("wgpu-{name}"))),
        );
        for (at, tolerance) in [(0, 1e-4), (1, 1e-3)] {
            let (row, reference) = (wgpu[at], flex[at]);
            assert_eq!(row.0, reference.0);
            assert!(
                (row.1 - reference.1).abs() < tolerance && (row.2 - reference.2).abs() < tolerance,
                "wgpu {name}: {row:?} vs flex {reference:?}"
            );
        }
    }
}

/// Muon with the warmup-stable-decay schedule on wgpu: Burn's optimizer through the host
/// engine (the device engine's update is an AdamW kernel), the loss finite and falling, and a
/// run stopped at step 4 and resumed where the uninterrupted one ends, Muon's velocities and
/// step counts included. (fused and flex, bit for bit: `train/engine/tests.rs`.)
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn muon_and_wsd_train_and_resume_on_wgpu() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let settings = [
        "--set",
        "train.optimizer=\"muon\"",
        "--set",
        "train.lr_schedule=\"wsd\"",
        "--set",
        "train.warmup_iters=2",
        "--set",
        "train.lr_decay_iters=8",
        "--set",
        "train.eval_interval=4",
    ];
    let engine = train(dir, "whole", Backend::Wgpu, 8, &settings, false);
    assert_eq!(engine, ("autodiff".into(), "wgpu".into()));
    train(dir, "halves", Backend::Wgpu, 4, &settings, false);
    train(dir, "halves", Backend::Wgpu, 8, &[], true);
    let (whole, halves) = (metrics(&dir.join("whole")), metrics(&dir.join("halves")));
    assert_eq!(whole.len(), 3, "{whole:?}");
    assert!(whole.iter().all(|r| r.1.is_finite() && r.2.is_finite()));
    assert!(whole[2].1 < whole[0].1, "the loss falls: {whole:?}");
    // The kernels autotune picks by timing may round differently between the two runs.
    for (w, h) in whole.iter().zip(&halves) {
        assert_eq!(w.0, h.0);
        assert!(
            (w.1 - h.1).abs() < 1e-4 && (w.2 - h.2).abs() < 1e-4,
            "{w:?} vs {h:?}"
        );
    }
    let (a, b) = (weights(&dir.join("whole")), weights(&dir.join("halves")));
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        let worst = x
            .iter()
            .zip(y)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-4, "{name}: {worst} after resuming");
    }
}
