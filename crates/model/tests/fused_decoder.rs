//! The fused CPU decoder against Burn's `Gpt::forward` and `Gpt::generate`: the same logits at
//! every step of a KV-cached decode, the same tokens while the window slides, typed errors.

mod common;

use burn::tensor::{Device, Int, Tensor, TensorData};
use common::seeded;
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{Decoder, FusedDecoder, GenerateOptions, Gpt, GptConfig, ModelError, generate};

fn tokens(len: usize, vocab: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| ((i * 2654435761) >> 7) as u32 % vocab as u32)
        .collect()
}

/// The last position's logits of `Gpt::forward` over `context`.
fn burn_logits(gpt: &Gpt, context: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = context.iter().map(|&t| t.into()).collect();
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new(ids, [1, context.len()]),
        &gpt.wte.weight.device(),
    );
    let logits = gpt.forward(ids).unwrap();
    let [_, seq, vocab] = logits.dims();
    logits
        .slice([0..1, seq - 1..seq, 0..vocab])
        .into_data()
        .try_to_vec::<f32>()
        .unwrap()
}

/// Every config the decoder must cover: biases on and off, tied and untied heads, head sizes
/// under and over the 16-lane dot product, widths that are not a multiple of 4, and each newer
/// part (RMSNorm with and without gain, no norm, ReLU², SwiGLU, a soft-cap, rotary positions,
/// no positions, QK-norm, grouped and multi-query heads) and Llama's and nanochat's
/// combinations of them.
fn configs() -> Vec<GptConfig> {
    let small = || {
        GptConfig::new(13)
            .with_block_size(24)
            .with_n_layer(2)
            .with_n_head(3)
            .with_n_embd(30)
    };
    let modern = GptConfig::modern(13);
    vec![
        small().with_norm(Norm::Rms),
        small().with_norm(Norm::RmsUnit).with_mlp(Mlp::Relu2),
        small().with_mlp(Mlp::GeluTanh),
        GptConfig::minimal(13).with_block_size(24),
        small().with_norm(Norm::None).with_logit_softcap(2.0),
        small().with_position(Position::Rope).with_qk_norm(true),
        small().with_position(Position::None),
        small().with_mlp(Mlp::SwiGlu).with_n_kv_head(Some(1)),
        GptConfig::new(13)
            .with_block_size(24)
            .with_n_layer(2)
            .with_n_head(6)
            .with_n_kv_head(Some(2))
            .with_n_embd(48)
            .with_position(Position::Rope)
            .with_norm(Norm::Rms)
            .with_mlp(Mlp::SwiGlu)
            .with_bias(false),
        small()
            .with_position(modern.position)
            .with_norm(modern.norm)
            .with_qk_norm(true)
            .with_mlp(modern.mlp)
            .with_bias(false)
            .with_tie_embeddings(false)
            .with_logit_softcap(modern.logit_softcap),
        GptConfig::new(13)
            .with_block_size(24)
            .with_n_layer(2)
            .with_n_head(3)
            .with_n_embd(30),
        GptConfig::new(13)
            .with_block_size(24)
            .with_n_layer(2)
            .with_n_head(2)
            .with_n_embd(72)
            .with_bias(false)
            .with_tie_embeddings(false),
    ]
}

/// A prompt fed at once (a whole window), then three tokens after it (several rows behind a
/// cache), then one token at a time to the full block:
/// after each feed, the logits equal the last row of a full forward over everything fed.
#[test]
fn cached_logits_match_a_full_forward() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = config.init(&device).unwrap();
        let mut decoder = FusedDecoder::new(&gpt).unwrap();
        let stream = tokens(config.block_size, config.vocab_size);
        let mut fed = 0;
        for step in [5, 3].into_iter().chain(std::iter::repeat_n(1, 16)) {
            let got = decoder.feed(&stream[fed..fed + step]).unwrap();
            fed += step;
            assert_eq!(decoder.cached(), fed);
            let want = burn_logits(&gpt, &stream[..fed]);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = got
                .iter()
                .zip(&want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-4 * scale,
                "{config:?} after {fed} tokens: max diff {diff} vs scale {scale}"
            );
        }
        // After clearing, the cache starts again at position 0.
        decoder.clear();
        let again = decoder.feed(&stream[..3]).unwrap();
        let want = burn_logits(&gpt, &stream[..3]);
        assert!(again.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}

/// Greedy and seeded sampling give Burn's tokens over 3 × block_size tokens, so the window
/// slides and the cache is rebuilt from a many-token window every step.
#[test]
fn generates_the_tokens_burn_generates() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = config.init(&device).unwrap();
        for options in [
            GenerateOptions {
                temperature: 0.0,
                max_new_tokens: 3 * config.block_size,
                ..Default::default()
            },
            GenerateOptions {
                temperature: 1.0,
                top_k: None,
                max_new_tokens: 3 * config.block_size,
                ..Default::default()
            },
        ] {
            let want = gpt.generate(&[1, 2, 3], &options, |_| {}).unwrap();
            let mut decoder = FusedDecoder::new(&gpt).unwrap();
            let mut streamed = Vec::new();
            let got = generate(&mut decoder, &[1, 2, 3], &options, |t| streamed.push(t)).unwrap();
            assert_eq!(got.len(), 3 * config.block_size);
            assert_eq!(got, want, "{config:?}, temperature {}", options.temperature);
            assert_eq!(streamed, got);
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let _seeded = seeded();
    let device = Device::flex();
    let config = configs().remove(0);
    let gpt = config.init(&device).unwrap();
    let mut decoder = FusedDecoder::new(&gpt).unwrap();
    assert_eq!(
        decoder.feed(&[13]).unwrap_err(),
        ModelError::TokenOutOfRange {
            id: 13,
            vocab_size: 13
        }
    );
    assert!(matches!(
        decoder.feed(&[]).unwrap_err(),
        ModelError::Attention(_)
    ));
    decoder.feed(&tokens(20, 13)).unwrap();
    let too_long = decoder.feed(&tokens(5, 13)).unwrap_err();
    assert_eq!(
        too_long.to_string(),
        "sequence of 25 tokens is longer than the context of 24 tokens"
    );
    // A failed feed leaves the cache as it was.
    assert_eq!(decoder.cached(), 20);
}
