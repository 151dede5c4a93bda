//! What a sampled token costs a GPU, as `tinygpt bench` counts it: on wgpu (lavapipe in CI),
//! after a warm-up, `Gpt`'s decoder samples 100 more tokens with one host read per token and
//! (nearly) no kernel compiled; a decoder whose KV cache grows with every token (new shapes
//! each time) is caught compiling dozens. One test, so no other test's kernels run meanwhile:
//! the counts are the whole process's.
//!
//! "Nearly": Burn's kernel fusion chooses its fused kernels as the operations stream in, and
//! once in a while, depending on timing, picks a variant it had not used before (one kernel in
//! one CI run of 100 tokens, none in ten runs here; the growing caches' count moves by one the
//! same way). Two are allowed; a cache that re-shapes per token compiles about two dozen.

use burn::tensor::{Device, Int, Tensor, TensorData};
use tinygpt::backend::Backend;
use tinygpt::token_cost::{count, warm_up};
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{Decoder, Gpt, GptConfig, decoding::DecodeStep, decoding::Pick};

const VOCAB: usize = 40;
/// Tokens sampled before the counted 100 (the block is 128: no window rebuild).
const WARM_UP: usize = 16;

/// The pick for token `i`: sampled at temperature 0.8 with a draw that varies.
fn pick(i: usize) -> Pick {
    Pick {
        temperature: 0.8,
        top_k: None,
        uniform: (i as f64 * 0.618_034).fract(),
        vocab: VOCAB,
    }
}

/// `tokens` more tokens after `token` through `step`; the last one.
fn sample(
    tokens: std::ops::Range<usize>,
    mut token: u32,
    mut step: impl FnMut(u32, &Pick) -> u32,
) -> u32 {
    for i in tokens {
        token = step(token, &pick(i));
    }
    token
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn after_warm_up_a_gpu_token_compiles_nothing_and_reads_the_host_once() {
    let device = Backend::Wgpu.placement().unwrap().device;
    let gpt = GptConfig::new(VOCAB)
        .with_block_size(128)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32)
        .init(&device)
        .unwrap();
    assert_eq!(gpt.kernels(), Kernels::Cube);

    // The model's decoders: fixed-capacity caches, the pick on the device, the step's
    // launches the same at every position (recorded and replayed, or run again).
    for way in [DecodeStep::Step, DecodeStep::Captured] {
        let mut decoder = gpt.decoder_with(way);
        let mut step = |token: u32, pick: &Pick| decoder.feed_and_pick(&[token], pick).unwrap().id;
        let (token, warm) = warm_up(|| Ok(sample(0..WARM_UP, 1, &mut step))).unwrap();
        let cost = count(&warm, || {
            sample(WARM_UP..WARM_UP + 100, token, &mut step);
            Ok(100)
        })
        .unwrap();
        eprintln!("{way:?}: {cost:?}");
        assert!(cost.compiles_after_warmup <= 2, "{way:?}: {cost:?}");
        assert_eq!(cost.host_reads_per_token, 1.0, "{way:?}: {cost:?}");
        assert!(cost.launches_per_token >= 1.0, "{way:?}: {cost:?}");
    }

    // The same tokens through caches that grow: every token's attention has a new length.
    let mut caches = gpt.new_caches();
    let mut step = |token: u32, pick: &Pick| growing_step(&gpt, &device, &mut caches, token, pick);
    let (token, warm) = warm_up(|| Ok(sample(0..WARM_UP, 1, &mut step))).unwrap();
    let grown = count(&warm, || {
        sample(WARM_UP..WARM_UP + 100, token, &mut step);
        Ok(100)
    })
    .unwrap();
    eprintln!("growing caches: {grown:?}");
    assert!(grown.compiles_after_warmup >= 10, "{grown:?}");
}

/// One token through `gpt` with growing caches, picked on the device.
fn growing_step(
    gpt: &Gpt,
    device: &Device,
    caches: &mut [tinygpt_attention::KvCache],
    token: u32,
    pick: &Pick,
) -> u32 {
    let ids = Tensor::<2, Int>::from_data(TensorData::new(vec![token as i64], [1, 1]), device);
    let logits = gpt.forward_cached(ids.into(), caches).unwrap();
    let vocab = logits.dims()[2];
    pick.on_device(logits.reshape([vocab])).id
}
