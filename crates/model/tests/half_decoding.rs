//! Decoding with half-precision matrices (`--weights bf16|f16`: [`Gpt::autocast`] outside
//! autodiff): the products in bf16 or f16, summed in f32 by the rows kernel, the KV caches in
//! the same dtype, the residual stream, norms, softmax and logits in f32. Each way a decoder
//! feeds its tokens gives the f32 model's logits to the half dtype's rounding, and not the
//! f32 logits exactly (the products did run in half precision). wgpu is lavapipe in CI (f16;
//! WGSL has no bf16); flex runs bf16 through Burn's growing caches.

mod common;

use burn::module::Module;
use burn::tensor::{DType, Device, FloatDType};
use common::seeded;
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{Decoder, Gpt, GptConfig, decoding::DecodeStep};

/// The logits after each of `tokens`: the first 5 fed as a prompt, then one at a time.
fn logits_along(decoder: &mut dyn Decoder, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut all = vec![decoder.feed(&tokens[..5]).unwrap()];
    for &token in &tokens[5..] {
        all.push(decoder.feed(&[token]).unwrap());
    }
    all
}

/// The largest difference between `got` and `want`, over every position and id, and the
/// largest magnitude of `want`.
fn largest_difference(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f32, f32) {
    let pairs = got.iter().flatten().zip(want.iter().flatten());
    let diff = pairs.map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
    let size = want.iter().flatten().map(|w| w.abs()).fold(0.0, f32::max);
    (diff, size)
}

/// `gpt`'s `dtype` copy decoded the ways `steps` name, over a whole window, beside `gpt` (f32,
/// decoded the first way): within `tolerance` of the f32 logits (relative to their largest),
/// never equal.
fn half_follows_f32(gpt: &Gpt, dtype: FloatDType, steps: &[DecodeStep], tolerance: f32) {
    let half = gpt.autocast(dtype);
    assert_eq!(half.dtype(), DType::from(dtype));
    // What a server counts against the memory: the half copy's matrices at 2 bytes a weight
    // (these small models are mostly matrices: well under 60% of f32's bytes).
    assert_eq!(gpt.bytes(), 4 * gpt.num_params());
    assert!(
        10 * half.bytes() < 6 * gpt.bytes(),
        "{} of {}",
        half.bytes(),
        gpt.bytes()
    );
    let tokens = common::tokens(gpt.block_size(), gpt.vocab_size());
    let want = logits_along(&mut gpt.decoder_with(steps[0]), &tokens);
    for &step in steps {
        let got = logits_along(&mut half.decoder_with(step), &tokens);
        assert_eq!(got.len(), want.len());
        let (diff, size) = largest_difference(&got, &want);
        let what = format!("{dtype:?} {step:?}: largest difference {diff}, largest logit {size}");
        eprintln!("{what}");
        assert!(got.iter().flatten().all(|l| l.is_finite()), "{what}");
        assert!(diff <= tolerance * size, "{what}");
        assert!(diff > 0.0, "{what}: the same logits as f32");
    }
}

/// f16 on wgpu, both kinds of launches a GPU feeds a token with (through `forward_cached`, and
/// the fixed step, recorded and replayed: on wgpu a replay runs the step again, so
/// [`DecodeStep::Step`] is the same kernels), classic parts.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn f16_decoding_on_wgpu_follows_f32() {
    f16_on_wgpu_follows_f32(common::small());
}

/// The same with the `modern` preset's parts (a test of its own, so that the two run side by
/// side on two devices).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn f16_decoding_of_modern_parts_on_wgpu_follows_f32() {
    f16_on_wgpu_follows_f32(common::modern_parts());
}

fn f16_on_wgpu_follows_f32(config: GptConfig) {
    let wgpu = common::wgpu_device_of_two();
    assert!(
        wgpu.supports_dtype(DType::F16),
        "this wgpu adapter has no f16 (lavapipe has)"
    );
    let on_gpu = common::drawn_on_flex(&config)
        .to_device(&wgpu)
        .with_kernels(Kernels::for_device(&wgpu));
    assert_eq!(on_gpu.kernels(), Kernels::Cube);
    let steps = [DecodeStep::Captured, DecodeStep::Forward];
    half_follows_f32(&on_gpu, FloatDType::F16, &steps, 2e-3);
}

/// bf16 on flex (Burn's growing caches: a CPU has one way).
#[test]
fn bf16_decoding_on_flex_follows_f32() {
    let _seeded = seeded();
    for config in [common::small(), common::modern_parts()] {
        let gpt = common::init(&config, &Device::flex());
        half_follows_f32(&gpt, FloatDType::BF16, &[DecodeStep::Captured], 1.5e-2);
    }
}
