//! `train.dtype`: mixed-precision training where the backend has the dtype, f32 checkpoints
//! whatever the step computed in, and a one-line refusal where it does not.

mod common;

use std::path::Path;
use std::process::Output;

use common::*;

/// `tinygpt train --config baby` on the built-in corpus for `steps` steps in `dtype` on flex,
/// evaluated at the end only.
fn baby(dir: &Path, out: &str, dtype: &str, steps: &str) -> Output {
    tinygpt(
        dir,
        &[
            "train",
            "--config",
            "baby",
            "--data",
            corpus().to_str().unwrap(),
            "--out",
            out,
            "--backend",
            "flex",
            "--max-iters",
            steps,
            "--set",
            &format!("train.dtype={dtype}"),
            "--set",
            &format!("train.eval_interval={steps}"),
            "--set",
            "train.eval_iters=4",
            "--set",
            "train.sample_tokens=0",
        ],
    )
}

/// 100 steps of the baby model in bf16 end within 2% of the f32 run's losses; the checkpoint
/// holds f32 weights, the fused CPU engine samples from it, and the run resumes in f32.
#[test]
fn bf16_trains_the_baby_model_as_f32_does_and_checkpoints_f32() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    ok(baby(dir, "f32", "f32", "100"));
    ok(baby(dir, "bf16", "bf16", "100"));
    let (want, got) = (metrics(&dir.join("f32")), metrics(&dir.join("bf16")));
    assert_eq!((want[0].0, got[0].0), (0, 0));
    // Step 0: the same initial weights, evaluated in f32 and in bf16.
    assert!((want[0].2 - got[0].2).abs() < 1e-2, "{want:?} vs {got:?}");
    let (w, g) = (want.last().unwrap(), got.last().unwrap());
    assert_eq!((w.0, g.0), (100, 100));
    assert!(w.2 < want[0].2 - 1.0, "f32 did not learn: {want:?}");
    for (f32_loss, bf16_loss) in [(w.1, g.1), (w.2, g.2)] {
        let off = (bf16_loss - f32_loss).abs() / f32_loss;
        assert!(off < 0.02, "bf16 {bf16_loss} vs f32 {f32_loss}: {off:.4}");
    }

    let bytes = std::fs::read(dir.join("bf16/last/model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for (name, view) in file.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
    }
    let sample = ok(tinygpt(
        dir,
        &[
            "generate",
            "--checkpoint",
            "bf16",
            "--backend",
            "fused",
            "--max-new-tokens",
            "20",
            "--seed",
            "1",
        ],
    ));
    assert!(!sample.trim().is_empty());
    ok(tinygpt(
        dir,
        &[
            "train",
            "--out",
            "bf16",
            "--resume",
            "--backend",
            "flex",
            "--max-iters",
            "105",
            "--set",
            "train.dtype=f32",
        ],
    ));
    assert_eq!(metrics(&dir.join("bf16")).last().unwrap().0, 105);
}

/// f16 with its loss scale trains on flex as f32 does.
#[test]
fn f16_trains_with_a_loss_scale() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let steps = ["--max-iters", "20", "--set", "train.eval_interval=20"];
    let f16 = [&steps[..], &["--set", "train.dtype=f16"]].concat();
    ok(train(dir, "f32", &steps));
    ok(train(dir, "f16", &f16));
    let (want, got) = (metrics(&dir.join("f32")), metrics(&dir.join("f16")));
    assert!((want[0].2 - got[0].2).abs() < 1e-2, "{want:?} vs {got:?}");
    let (w, g) = (want.last().unwrap(), got.last().unwrap());
    assert_eq!(g.0, 20);
    assert!(g.2 < got[0].2, "f16 did not learn: {got:?}");
    assert!((w.2 - g.2).abs() / w.2 < 0.02, "{want:?} vs {got:?}");
}

/// On wgpu, f16 trains where the adapter has f16 arithmetic (lavapipe does), starting from
/// flex's f16 loss, and is refused in one line where it has not; bf16 never runs there (WGSL
/// has none).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn on_wgpu_f16_trains_where_the_adapter_has_it_and_bf16_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Two steps: lavapipe compiles every f16 kernel first.
    let short = [
        "--max-iters",
        "2",
        "--set",
        "train.eval_interval=2",
        "--set",
        "train.dtype=f16",
    ];
    let has_f16 = burn::tensor::Device::enumerate(burn::tensor::DeviceType::Wgpu)
        .into_vec()
        .first()
        .expect("NO WGPU ADAPTER FOUND: install mesa-vulkan-drivers for lavapipe")
        .supports_dtype(burn::tensor::DType::F16);
    let out = train_on(dir, "wgpu", "wgpu", &short);
    match has_f16 {
        true => {
            ok(out);
            ok(train(dir, "flex", &short));
            let (gpu, flex) = (metrics(&dir.join("wgpu")), metrics(&dir.join("flex")));
            assert!(
                (gpu[0].2 - flex[0].2).abs() < 1e-2,
                "{gpu:?} vs flex {flex:?}"
            );
            assert!(gpu.iter().all(|row| row.2.is_finite()), "{gpu:?}");
        }
        false => fails(out, "train.dtype = \"f16\" is not supported on"),
    }
    fails(
        train_on(
            dir,
            "bf16",
            "wgpu",
            &["--set", "train.dtype=bf16", "--max-iters", "2"],
        ),
        "train.dtype = \"bf16\" is not supported on",
    );
    assert!(!dir.join("bf16").exists(), "a refused run was written");
}

/// Where the dtype cannot run: one line, nothing written.
#[test]
fn a_backend_without_the_dtype_is_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bf16 = ["--set", "train.dtype=bf16", "--max-iters", "2"];
    fails(
        train_on(dir, "fused", "fused", &bf16),
        "the fused CPU engine computes in f32 only, not train.dtype = \"bf16\"",
    );
    fails(
        train_on(dir, "ndarray", "ndarray", &bf16),
        "train.dtype = \"bf16\" is not supported on",
    );
    fails(
        train_on(dir, "f8", "flex", &["--set", "train.dtype=f8"]),
        "dtype",
    );
    for out in ["fused", "ndarray", "f8"] {
        assert!(!dir.join(out).exists(), "{out} was written");
    }
    // `auto` without a GPU takes flex for it, and says why; on CUDA it trains there; a wgpu
    // GPU has no bf16 and refuses it in one line.
    let out = train_on(dir, "auto", "auto", &bf16);
    if !out.status.success() {
        return fails(out, "train.dtype = \"bf16\" is not supported on");
    }
    let log = ok(out);
    match engine_of(&log) {
        (kind, device) if device == "flex" => {
            assert_eq!(kind, "autodiff", "{log}");
            assert!(log.contains("computes in f32 only"), "{log}");
            assert!(log.contains("training on flex"), "{log}");
        }
        (kind, device) => assert_eq!((kind.as_str(), device.as_str()), ("device", "cuda")),
    }
}
