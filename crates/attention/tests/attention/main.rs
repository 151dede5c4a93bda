//! Behaviour of `CausalSelfAttention` on every backend: flex, ndarray and wgpu (lavapipe in CI).
//!
//! Each check is a function of a `Device`; `backend_tests!` runs it once per backend. The
//! packed QK kernels (`packed_qk`) run on wgpu only.

mod batched;
mod decode_attention;
mod draws;
mod lora;
mod newer;
mod next_token;
mod packed_qk;
mod reference;
mod seeds;

use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Bool, Device, Tensor, TensorData};
use draws::{drawn, fresh_draws, random};
use reference::reference;
use tinygpt_attention::mask::{
    causal_mask, mask_then_softmax, softmax_then_renormalise, tril, triu,
};
use tinygpt_attention::{
    AttentionConfigError, AttentionError, AttentionKernel, CausalSelfAttention,
    CausalSelfAttentionConfig, Kernels, KvCache, Pass, StepAt, StepTables,
};

// ---------------------------------------------------------------- helpers

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec_as::<f32>().unwrap()
}

/// max |a - b| / max |b|: the error relative to the reference's scale.
fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    let scale = b
        .iter()
        .fold(0f64, |m, &x| m.max(x.abs() as f64))
        .max(1e-12);
    let diff = a
        .iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()));
    diff / scale
}

fn assert_close(a: &[f32], b: &[f32], tol: f64, what: &str) {
    assert!(a.iter().all(|x| x.is_finite()), "{what}: non-finite values");
    let err = rel_err(a, b);
    assert!(err <= tol, "{what}: relative error {err:e} > {tol:e}");
}

fn config(d_model: usize, n_heads: usize, max_seq_len: usize) -> CausalSelfAttentionConfig {
    // A larger init than GPT-2's 0.02 so the softmax is far from uniform and mistakes show.
    CausalSelfAttentionConfig::new(d_model, n_heads, max_seq_len).with_init_std(0.3)
}

fn layer(
    d_model: usize,
    n_heads: usize,
    max_seq_len: usize,
    device: &Device,
) -> CausalSelfAttention {
    drawn(&config(d_model, n_heads, max_seq_len), device)
}

fn with_kernel(layer: &CausalSelfAttention, kernel: AttentionKernel) -> CausalSelfAttention {
    layer.clone().with_kernel(kernel)
}

/// `[batch, seq]` padding mask from per-row flags.
fn padding(rows: &[&[bool]], device: &Device) -> Tensor<2, Bool> {
    let flat: Vec<bool> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), rows[0].len()]), device)
}

// ---------------------------------------------------------------- checks

/// Changing token j never changes any output before j, and does change the output at j.
fn causality(device: &Device) {
    let layer = layer(32, 4, 16, device);
    let (batch, seq, d) = (2, 10, 32);
    let x = random([batch, seq, d], device);
    let before = values(layer.forward(x.clone(), None, Pass::Infer).unwrap());
    for j in [0, 4, seq - 1] {
        let changed = x
            .clone()
            .slice_assign([0..batch, j..j + 1, 0..d], random([batch, 1, d], device));
        let after = values(layer.forward(changed, None, Pass::Infer).unwrap());
        for b in 0..batch {
            for t in 0..seq {
                let row = |v: &[f32]| v[(b * seq + t) * d..(b * seq + t + 1) * d].to_vec();
                if t < j {
                    assert_eq!(
                        row(&before),
                        row(&after),
                        "output {t} changed when token {j} changed"
                    );
                } else if t == j {
                    assert_ne!(
                        row(&before),
                        row(&after),
                        "output {t} ignored its own token"
                    );
                }
            }
        }
    }
}

/// A sequence's output does not depend on what else is in the batch.
fn batch_independence(device: &Device) {
    let layer = layer(32, 4, 16, device);
    let (batch, seq, d) = (3, 9, 32);
    let x = random([batch, seq, d], device);
    let together = values(layer.forward(x.clone(), None, Pass::Infer).unwrap());
    for b in 0..batch {
        let alone = values(
            layer
                .forward(x.clone().slice([b..b + 1, 0..seq, 0..d]), None, Pass::Infer)
                .unwrap(),
        );
        let part = &together[b * seq * d..(b + 1) * seq * d];
        assert_close(part, &alone, 1e-5, "batched vs alone");
    }
}

/// Right padding leaves the real tokens' outputs unchanged; padded keys get weight 0; a query
/// whose keys are all padding (left padding) gets zero weights and finite output.
fn padding_mask(device: &Device) {
    let layer = layer(16, 2, 8, device);
    let (seq, d) = (6, 16);
    let x = random([2, seq, d], device);
    let pad_rows: [&[bool]; 2] = [
        &[false, false, false, false, true, true], // right padding: 4 real tokens
        &[true, true, false, false, false, false], // left padding: queries 0, 1 see no key
    ];
    let pad = padding(&pad_rows, device);
    let (y, weights) = layer
        .forward_with_weights(x.clone(), Some(pad.clone()), Pass::Infer)
        .unwrap();
    let y = values(y);
    assert!(
        y.iter().all(|v| v.is_finite()),
        "padding produced non-finite outputs"
    );

    let real = values(
        layer
            .forward(x.clone().slice([0..1, 0..4, 0..d]), None, Pass::Infer)
            .unwrap(),
    );
    assert_close(&y[..4 * d], &real, 1e-5, "right-padded vs unpadded");

    let w = values(weights); // [2, heads, seq, seq]
    let heads = 2;
    for b in 0..2 {
        for h in 0..heads {
            for i in 0..seq {
                let row = &w[((b * heads + h) * seq + i) * seq..][..seq];
                for (j, &wij) in row.iter().enumerate() {
                    if pad_rows[b][j] || j > i {
                        assert_eq!(wij, 0.0, "hidden key {j} of query {i} has weight {wij}");
                    }
                }
                let sum: f32 = row.iter().sum();
                let any_visible = (0..=i).any(|j| !pad_rows[b][j]);
                let expected = if any_visible { 1.0 } else { 0.0 };
                assert!((sum - expected).abs() < 1e-5, "row {i} sums to {sum}");
            }
        }
    }
    let flat_pad: Vec<bool> = pad_rows.iter().flat_map(|r| r.iter().copied()).collect();
    let expect = reference(&layer, &values(x.clone()), [2, seq, d], Some(&flat_pad));
    assert_close(&y, &expect, 1e-5, "padded explicit vs f64 reference");
    let sdpa = values(
        with_kernel(&layer, AttentionKernel::Sdpa)
            .forward(x, Some(pad), Pass::Infer)
            .unwrap(),
    );
    assert_close(&sdpa, &expect, 1e-5, "padded SDPA vs f64 reference");
}

/// Weights for inspection: `[batch, heads, seq, seq]`, rows sum to 1, zeros above the diagonal.
fn weights_are_causal(device: &Device) {
    let layer = layer(24, 3, 12, device);
    let (batch, heads, seq) = (2, 3, 7);
    let (_, weights) = layer
        .forward_with_weights(random([batch, seq, 24], device), None, Pass::Infer)
        .unwrap();
    assert_eq!(weights.dims(), [batch, heads, seq, seq]);
    let w = values(weights);
    for row in w.chunks(seq).enumerate() {
        let (index, row) = row;
        let i = index % seq;
        assert!(
            (row.iter().sum::<f32>() - 1.0).abs() < 1e-5,
            "row does not sum to 1: {row:?}"
        );
        assert!(
            row[i + 1..].iter().all(|&x| x == 0.0),
            "weight above the diagonal: {row:?}"
        );
        assert!(
            row[..=i].iter().all(|&x| x > 0.0),
            "visible key with zero weight: {row:?}"
        );
    }
}

/// Method (a) fill-then-softmax and method (b) softmax-then-renormalise give the same weights.
fn two_masking_methods_agree(device: &Device) {
    let (seq, shape) = (7, [2, 3, 7, 7]);
    let scores = random(shape, device) * 3.0;
    let hidden = causal_mask(seq, device)
        .reshape([1, 1, seq, seq])
        .expand(shape);
    let keep = tril(seq, device).reshape([1, 1, seq, seq]);
    let a = values(mask_then_softmax(scores.clone(), hidden));
    let b = values(softmax_then_renormalise(scores, keep));
    assert_close(
        &a,
        &b,
        1e-6,
        "fill-then-softmax vs softmax-then-renormalise",
    );
}

/// SDPA == explicit == f64 reference, on fresh random inputs, under Auto too.
fn sdpa_explicit_reference_agree(device: &Device) {
    let layer = layer(48, 6, 32, device);
    let dims = [3, 20, 48];
    let x = random(dims, device);
    let expect = reference(&layer, &values(x.clone()), dims, None);
    for kernel in [
        AttentionKernel::Explicit,
        AttentionKernel::Sdpa,
        AttentionKernel::Auto,
    ] {
        let got = values(
            with_kernel(&layer, kernel)
                .forward(x.clone(), None, Pass::Infer)
                .unwrap(),
        );
        assert_close(&got, &expect, 1e-5, &format!("{kernel:?} vs f64 reference"));
    }
    // The same under autodiff, where the module records a graph.
    let ad = device.clone().autodiff();
    let tracked = layer.clone().to_device(&ad);
    let got = values(
        tracked
            .forward(x.to_device(&ad), None, Pass::Infer)
            .unwrap(),
    );
    assert_close(&got, &expect, 1e-5, "autodiff vs f64 reference");
}

/// `x` `[batch, seq, d]` fed through `cache` in `pieces`: the outputs, concatenated.
fn feed_in_pieces(
    layer: &CausalSelfAttention,
    x: &Tensor<3>,
    pieces: &[usize],
    cache: &mut KvCache,
) -> Vec<f32> {
    let [batch, _, d] = x.dims();
    let mut outs = Vec::new();
    let mut start = 0;
    for &n in pieces {
        let piece = x.clone().slice([0..batch, start..start + n, 0..d]);
        outs.push(layer.forward_cached(piece, cache).unwrap());
        start += n;
    }
    values(Tensor::cat(outs, 1))
}

/// Feeding a sequence in pieces through the KV cache gives the full forward's outputs, with a
/// growing cache and with one of fixed capacity (whose rows not written yet, and rows left from
/// before a `clear`, must be invisible).
fn kv_cache_matches_full_forward(device: &Device) {
    let layer = layer(32, 4, 12, device);
    let (batch, seq, d) = (2, 12, 32);
    let x = random([batch, seq, d], device);
    let full = layer.forward(x.clone(), None, Pass::Infer).unwrap();
    let short = random([batch, 5, d], device);
    let short_full = values(layer.forward(short.clone(), None, Pass::Infer).unwrap());
    for (kernel, fixed) in [
        AttentionKernel::Auto,
        AttentionKernel::Explicit,
        AttentionKernel::Sdpa,
    ]
    .into_iter()
    .flat_map(|kernel| [(kernel, false), (kernel, true)])
    {
        let layer = with_kernel(&layer, kernel);
        for pieces in [&[1usize; 12][..], &[3, 1, 5, 1, 2][..]] {
            let mut cache = match fixed {
                true => KvCache::with_capacity(seq),
                false => KvCache::new(),
            };
            let what = format!("{kernel:?} fixed {fixed} cache {pieces:?}");
            let cached = feed_in_pieces(&layer, &x, pieces, &mut cache);
            assert_eq!(cache.len(), seq);
            assert_close(&cached, &values(full.clone()), 1e-5, &what);
            // Refilled after a clear, a shorter sequence sees none of the old rows.
            cache.clear();
            let refilled = feed_in_pieces(&layer, &short, &[2, 1, 2], &mut cache);
            assert_close(&refilled, &short_full, 1e-5, &format!("{what}, refilled"));
            cache.clear();
            feed_in_pieces(&layer, &x, pieces, &mut cache);
            // A full cache refuses one more token and stays as it was.
            let more = layer.forward_cached(random([batch, 1, d], device), &mut cache);
            assert_eq!(
                more.unwrap_err(),
                AttentionError::SequenceTooLong {
                    len: seq + 1,
                    max: seq
                }
            );
            assert_eq!(cache.len(), seq);
        }
    }
}

/// Optimisation steps with dropout and padding (including fully padded rows): every loss and
/// every gradient is finite, and the loss goes down.
fn gradients_stay_finite(device: &Device) {
    let device = device.clone().autodiff();
    let mut layer = drawn(&config(32, 4, 16).with_dropout(0.1), &device);
    let mut optim = AdamWConfig::new().init();
    let (batch, seq, d) = (4, 16, 32);
    let x = random([batch, seq, d], &device);
    let target = random([batch, seq, d], &device);
    let mut pad_rows = vec![vec![false; seq]; batch];
    pad_rows[1][12..].fill(true); // right padding
    pad_rows[2][..3].fill(true); // left padding: fully masked queries
    let rows: Vec<&[bool]> = pad_rows.iter().map(|r| r.as_slice()).collect();
    let pad = padding(&rows, &device);
    let mut losses = Vec::new();
    for step in 0..40 {
        let y = layer
            .forward(x.clone(), Some(pad.clone()), Pass::Train)
            .unwrap();
        let loss = (y - target.clone()).powf_scalar(2.0).mean();
        let value = values(loss.clone())[0];
        assert!(value.is_finite(), "loss at step {step} is {value}");
        losses.push(value);
        let grads = loss.backward();
        for (name, grad) in [
            (
                "c_attn.weight",
                layer.c_attn.weight.grad(&grads).map(values),
            ),
            (
                "c_attn.bias",
                layer
                    .c_attn
                    .bias
                    .as_ref()
                    .and_then(|b| b.grad(&grads))
                    .map(values),
            ),
            (
                "c_proj.weight",
                layer.c_proj.weight.grad(&grads).map(values),
            ),
            (
                "c_proj.bias",
                layer
                    .c_proj
                    .bias
                    .as_ref()
                    .and_then(|b| b.grad(&grads))
                    .map(values),
            ),
        ] {
            let grad = grad.unwrap_or_else(|| panic!("{name} has no gradient"));
            assert!(
                grad.iter().all(|g| g.is_finite()),
                "{name} gradient not finite at step {step}"
            );
        }
        let grads = GradientsParams::from_grads(grads, &layer);
        layer = optim.step(2e-2, layer, grads);
    }
    assert!(
        losses[39] < 0.9 * losses[0],
        "loss did not go down: {losses:?}"
    );
}

/// Dropout acts on a training pass only, as the call says: training forwards differ; inference
/// forwards of the same layer on the same device are identical and equal the reference; a
/// training pass where nothing tracks gradients is refused.
fn dropout_only_in_training(device: &Device) {
    let ad = device.clone().autodiff();
    let layer = drawn(&config(32, 4, 16).with_dropout(0.5), &ad);
    let x = random([2, 8, 32], &ad);
    let a = values(layer.forward(x.clone(), None, Pass::Train).unwrap());
    let b = values(layer.forward(x.clone(), None, Pass::Train).unwrap());
    assert_ne!(a, b, "training forwards were identical despite dropout 0.5");
    let tracked = values(layer.forward(x.clone(), None, Pass::Infer).unwrap());
    assert_eq!(
        tracked,
        values(layer.forward(x.clone(), None, Pass::Infer).unwrap()),
        "an inference pass on a device that tracks gradients dropped out"
    );

    let eval = layer.valid();
    let err = eval
        .forward(random([2, 8, 32], device), None, Pass::Train)
        .unwrap_err();
    assert!(
        matches!(err, AttentionError::TrainWithoutGradients),
        "{err}"
    );
    let x = x.to_device(&device.clone());
    let c = values(eval.forward(x.clone(), None, Pass::Infer).unwrap());
    let d = values(eval.forward(x.clone(), None, Pass::Infer).unwrap());
    assert_eq!(c, d, "inference is not deterministic");
    let expect = reference(&eval, &values(x), [2, 8, 32], None);
    assert_close(
        &c,
        &expect,
        1e-5,
        "inference with dropout configured vs reference",
    );
    assert_close(&tracked, &expect, 1e-5, "an inference pass under autodiff");
}

fn too_long_is_an_error(device: &Device) {
    let layer = layer(16, 2, 8, device);
    let err = layer
        .forward(random([1, 9, 16], device), None, Pass::Infer)
        .unwrap_err();
    assert_eq!(err, AttentionError::SequenceTooLong { len: 9, max: 8 });
    assert_eq!(
        err.to_string(),
        "sequence of 9 tokens is longer than the context of 8 tokens"
    );
    let err = layer
        .forward(random([1, 4, 12], device), None, Pass::Infer)
        .unwrap_err();
    assert_eq!(
        err,
        AttentionError::WidthMismatch {
            expected: 16,
            got: 12
        }
    );
    let err = layer.forward(
        random([2, 4, 16], device),
        Some(padding(&[&[false; 3]], device)),
        Pass::Infer,
    );
    assert_eq!(
        err.unwrap_err(),
        AttentionError::PaddingMaskShape {
            expected: [2, 4],
            got: [1, 3]
        }
    );
}

// ---------------------------------------------------------------- backends

#[path = "../support/normals.rs"]
mod normals;
#[path = "../support/wgpu.rs"]
mod support_wgpu;
use support_wgpu::wgpu_device_of_two;

macro_rules! backend_tests {
    ($backend:ident, $device:expr $(, #[$attr:meta])?) => {
        mod $backend {
            use super::*;
            fn run(check: fn(&Device)) {
                let device = $device;
                fresh_draws();
                check(&device);
            }
            /// Dropout draws on the device, from the backend's one generator: a test that uses
            /// it holds this backend's lock and seeds it, so its masks are the same on every run.
            fn run_with_dropout(check: fn(&Device)) {
                static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
                let device = $device;
                let _held = GENERATOR
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                device.seed(draws::SEED);
                fresh_draws();
                check(&device);
            }
            #[test]
            $(#[$attr])?
            fn causality() {
                run(super::causality)
            }
            #[test]
            $(#[$attr])?
            fn batch_independence() {
                run(super::batch_independence)
            }
            #[test]
            $(#[$attr])?
            fn padding_mask() {
                run(super::padding_mask)
            }
            #[test]
            $(#[$attr])?
            fn weights_are_causal() {
                run(super::weights_are_causal)
            }
            #[test]
            $(#[$attr])?
            fn two_masking_methods_agree() {
                run(super::two_masking_methods_agree)
            }
            #[test]
            $(#[$attr])?
            fn sdpa_explicit_reference_agree() {
                run(super::sdpa_explicit_reference_agree)
            }
            #[test]
            $(#[$attr])?
            fn kv_cache_matches_full_forward() {
                run(super::kv_cache_matches_full_forward)
            }
            #[test]
            $(#[$attr])?
            fn gradients_stay_finite() {
                run_with_dropout(super::gradients_stay_finite)
            }
            #[test]
            $(#[$attr])?
            fn dropout_only_in_training() {
                run_with_dropout(super::dropout_only_in_training)
            }
            #[test]
            $(#[$attr])?
            fn adapter_dropout_drops_the_adapters_input_only() {
                run_with_dropout(super::lora::adapter_dropout_drops_the_adapters_input_only)
            }
            #[test]
            $(#[$attr])?
            fn too_long_is_an_error() {
                run(super::too_long_is_an_error)
            }
            #[test]
            $(#[$attr])?
            fn rows_decode_as_each_alone() {
                run(super::batched::rows_decode_as_each_alone)
            }
            #[test]
            $(#[$attr])?
            fn steps_decode_as_each_alone() {
                run(super::batched::steps_decode_as_each_alone)
            }
            #[test]
            $(#[$attr])?
            fn prompts_go_through_the_step_in_padded_chunks() {
                run(super::batched::prompts_go_through_the_step_in_padded_chunks)
            }
        }
    };
}

backend_tests!(flex, Device::flex());
// burn-ndarray is deprecated upstream in favour of flex; tinygpt still supports and tests it.
#[allow(deprecated)]
fn ndarray() -> Device {
    Device::ndarray()
}

backend_tests!(ndarray, ndarray());
// Two devices on the one adapter: the tests compile and run their kernels side by side.
backend_tests!(
    wgpu,
    wgpu_device_of_two(),
    #[cfg_attr(
        no_wgpu,
        ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
    )]
);
