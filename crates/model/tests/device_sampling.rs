//! Sampling on a GPU: the pick made with tensor ops where the logits are is the host sampler's
//! rule, and `Gpt`'s decoder on wgpu (fixed-capacity KV caches, tokens picked on the device)
//! gives the fused CPU decoder's tokens and log-probabilities. wgpu is lavapipe in CI.

mod common;

use std::ops::ControlFlow;

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{
    Decoder, Decoding, FusedDecoder, GenerateOptions, GptConfig, Sampled, decoding::DecodeStep,
    decoding::Pick, generate_cancellable,
};

/// Uniform numbers in [0, 1) from a fixed-seed xorshift: the same on every run.
fn uniforms(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Over random logits (a padded width of 40, 37 real ids), every temperature and top-k the
/// device takes: the pick made with tensor ops on wgpu is the host's, and so is its
/// log-probability.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn the_device_pick_on_wgpu_is_the_host_samplers_rule() {
    the_device_pick_is_the_host_samplers_rule(common::wgpu_device_of_two());
}

/// The same tensor ops on flex.
#[test]
fn the_device_pick_on_flex_is_the_host_samplers_rule() {
    the_device_pick_is_the_host_samplers_rule(Device::flex());
}

fn the_device_pick_is_the_host_samplers_rule(device: Device) {
    let mut uniform = uniforms(7);
    {
        for case in 0..120 {
            let logits: Vec<f32> = (0..40).map(|_| (uniform() * 8.0 - 4.0) as f32).collect();
            let pick = Pick {
                temperature: [0.0, 0.5, 1.0, 2.0][case % 4],
                top_k: [None, Some(1), Some(5), Some(37), Some(100)][case % 5],
                uniform: if case % 7 == 0 { 0.0 } else { uniform() },
                vocab: 37,
            };
            let on_device = Tensor::<1>::from_data(TensorData::new(logits.clone(), [40]), &device);
            let got = pick.on_device(on_device);
            let want = pick.on_host(&logits);
            assert_eq!(got.id, want.id, "{device:?} {pick:?}");
            assert!(got.id < 37, "a padding id was picked: {pick:?}");
            assert!(
                (got.logprob - want.logprob).abs() < 1e-4,
                "{got:?} vs {want:?}"
            );
            assert!(got.finite && want.finite);
        }
        let mut damaged = vec![0.5f32; 40];
        damaged[3] = f32::NAN;
        let pick = Pick {
            temperature: 1.0,
            top_k: None,
            uniform: 0.5,
            vocab: 37,
        };
        let on_device = Tensor::<1>::from_data(TensorData::new(damaged.clone(), [40]), &device);
        assert!(!pick.on_device(on_device).finite, "{device:?}");
        assert!(!pick.on_host(&damaged).finite);
    }
}

/// Generation through `decoder`: every token with its log-probability.
fn sample(decoder: &mut dyn Decoder, options: &GenerateOptions) -> Vec<Sampled> {
    let mut seen = Vec::new();
    generate_cancellable(decoder, &[1, 2, 3], options, |token| {
        seen.push(token.clone());
        ControlFlow::Continue(())
    })
    .unwrap();
    seen
}

/// Greedy, sampled, top-k and with alternatives' log-probabilities (the host path, same fixed
/// cache) over 3 × block_size tokens, so the window slides and the caches are refilled from a
/// whole window at every step: the tokens of the fused CPU decoder, log-probabilities to 1e-4.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn gpu_sampling_gives_the_fused_decoders_tokens() {
    let wgpu = common::wgpu_device_of_two();
    let config = GptConfig::new(13)
        .with_block_size(24)
        .with_n_layer(2)
        .with_n_head(3)
        .with_n_embd(30);
    let gpt = common::drawn_on_flex(&config);
    // Moved after it was built, a model keeps the kernels of the device it was built on:
    // decided again for the GPU.
    let on_gpu = gpt
        .clone()
        .to_device(&wgpu)
        .with_kernels(Kernels::for_device(&wgpu));
    assert_eq!(on_gpu.kernels(), Kernels::Cube);
    let long = 3 * config.block_size;
    let options = |temperature: f32, top_k: Option<usize>, top_logprobs: usize| GenerateOptions {
        temperature,
        top_k,
        top_logprobs,
        max_new_tokens: long,
        ..Default::default()
    };
    for (options, on_device) in [
        (options(0.0, None, 0), true),
        (options(1.0, None, 0), true),
        (options(0.8, Some(4), 0), true),
        (options(1.0, None, 2), false),
    ] {
        let mut gpu = common::Counted::new(on_gpu.decoder());
        assert!(gpu.picks_on_device());
        let got = sample(&mut gpu, &options);
        // Where the options allow it every token is picked on the device; alternatives'
        // log-probabilities need the logits on the host.
        let (picked, read) = (gpu.picked_on_device, gpu.logits_read);
        match on_device {
            true => assert_eq!((picked, read), (long, 0), "{options:?}"),
            false => assert_eq!((picked, read), (0, long), "{options:?}"),
        }
        let want = sample(&mut FusedDecoder::new(&gpt).unwrap(), &options);
        let ids = |s: &[Sampled]| s.iter().map(|t| t.id).collect::<Vec<_>>();
        let what = format!(
            "temperature {}, top_k {:?}",
            options.temperature, options.top_k
        );
        assert_eq!(got.len(), long, "{what}");
        assert_eq!(
            ids(&got),
            ids(&want),
            "{what}, picked on the device: {on_device}"
        );
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g.logprob - w.logprob).abs() < 1e-4,
                "{what}: {g:?} vs {w:?}"
            );
            assert_eq!(g.top.len(), options.top_logprobs);
        }
    }
}

/// Every way a decoder on a GPU feeds a new token ([`DecodeStep`]: through `forward_cached`,
/// the step with its position in a buffer, the step and pick recorded and replayed) gives the
/// fused CPU decoder's tokens and log-probabilities, for the classic parts and the `modern`
/// preset's (rotary positions, RMSNorm, QK-norm, ReLU², soft-capped logits, untied head), over
/// 3 × block_size tokens: within the first window and after it slides. And so does the step
/// without the rows and decode-attention kernels ([`Decoding`]'s other ways).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn every_decode_step_gives_the_fused_decoders_tokens() {
    let wgpu = common::wgpu_device_of_two();
    for config in [common::small(), common::modern_parts()] {
        let gpt = common::drawn_on_flex(&config);
        let on_gpu = gpt
            .clone()
            .to_device(&wgpu)
            .with_kernels(Kernels::for_device(&wgpu));
        let long = 3 * config.block_size;
        for (temperature, top_k) in [(0.0, None), (1.0, None), (0.8, Some(4))] {
            let options = GenerateOptions {
                temperature,
                top_k,
                max_new_tokens: long,
                ..Default::default()
            };
            let want = sample(&mut FusedDecoder::new(&gpt).unwrap(), &options);
            let without_kernels = Decoding {
                rows_kernel: false,
                attention_kernel: false,
                ..Decoding::default()
            };
            let ways = [
                (Decoding::default(), DecodeStep::Forward),
                (Decoding::default(), DecodeStep::Step),
                (Decoding::default(), DecodeStep::Captured),
                (without_kernels, DecodeStep::Step),
            ];
            for (decoding, step) in ways {
                let model = on_gpu.clone().with_decoding(decoding);
                let got = sample(&mut model.decoder_with(step), &options);
                let what =
                    format!("{decoding:?}, {step:?}, temperature {temperature}, top_k {top_k:?}");
                assert_eq!(got.len(), long, "{what}");
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.id, w.id, "{what}: token {i}");
                    assert!(
                        (g.logprob - w.logprob).abs() < 1e-4,
                        "{what}: {g:?} vs {w:?}"
                    );
                }
            }
        }
    }
}
