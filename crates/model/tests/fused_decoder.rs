//! The fused CPU decoder against Burn's `Gpt::forward` and `Gpt::generate`: the same logits at
//! every step of a KV-cached decode, the same tokens while the window slides, typed errors.

mod common;

use burn::tensor::{Device, Int, Tensor, TensorData};
use common::{configs, last_logits as burn_logits, seeded, tokens};
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{
    Decoder, FusedBatch, FusedDecoder, GenerateOptions, GptConfig, ModelError,
    decoding::PREFILL_CHUNK, generate,
};

/// A prompt fed at once (a whole window), then three tokens after it (several rows behind a
/// cache), then one token at a time to the full block:
/// after each feed, the logits equal the last row of a full forward over everything fed.
#[test]
fn cached_logits_match_a_full_forward() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = common::init(&config, &device);
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
        let gpt = common::init(&config, &device);
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
    let gpt = common::init(&config, &device);
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

/// A prompt longer than [`PREFILL_CHUNK`], fed whole to a decoder alone, and fed to a stream of
/// a batch a chunk a step while another stream decodes (as `serve` feeds prompts): after the
/// last chunk the logits are the same bit for bit, and Burn's to float rounding; so are the
/// logits of the tokens after it.
#[test]
fn a_long_prompt_fed_a_chunk_a_step_gives_what_it_gives_whole() {
    let _seeded = seeded();
    let device = Device::flex();
    let small = GptConfig::new(13)
        .with_block_size(2 * PREFILL_CHUNK + 40)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32);
    let modern = small
        .clone()
        .with_position(Position::Rope)
        .with_norm(Norm::Rms)
        .with_qk_norm(true)
        .with_mlp(Mlp::SwiGlu)
        .with_n_kv_head(Some(1));
    for config in [small, modern] {
        let gpt = common::init(&config, &device);
        let prompt = tokens(2 * PREFILL_CHUNK + 20, 13);
        let mut alone = FusedDecoder::new(&gpt).unwrap();
        let want = alone.feed(&prompt).unwrap();
        let burn = burn_logits(&gpt, &prompt);
        let scale = burn.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = want
            .iter()
            .zip(&burn)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(diff <= 1e-4 * scale, "{config:?}: {diff} vs {scale}");

        let mut batch = FusedBatch::new(&gpt, 2).unwrap();
        let other = tokens(8, 13);
        let chunks: Vec<&[u32]> = prompt.chunks(PREFILL_CHUNK).collect();
        for (k, chunk) in chunks.iter().enumerate() {
            let logits = batch.step(&[(0, chunk), (1, &other[k..=k])]).unwrap();
            if k + 1 == chunks.len() {
                assert_eq!(&logits[..13], &want[..], "{config:?}");
            }
        }
        for token in [1, 2, 3] {
            let want = alone.feed(&[token]).unwrap();
            let got = batch.step(&[(0, &[token])]).unwrap();
            assert_eq!(got, &want[..], "{config:?}");
        }
    }
}

/// Decoders sharing one copy of the weights (`FusedDecoder::share`, as a server's workers do)
/// each keep their own cache: fed different streams in turns, each gives exactly the logits a
/// decoder of its own gives.
#[test]
fn decoders_sharing_weights_keep_their_own_streams() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = common::init(&config, &device);
        let first = FusedDecoder::new(&gpt).unwrap();
        let mut shared = [first.share(), first.share()];
        let mut alone = [
            FusedDecoder::new(&gpt).unwrap(),
            FusedDecoder::new(&gpt).unwrap(),
        ];
        let stream = tokens(config.block_size, config.vocab_size);
        let streams = [&stream[..10], &stream[3..13]];
        for (fed, step) in [(0, 4), (4, 1), (5, 1), (6, 4)] {
            for s in 0..2 {
                let piece = &streams[s][fed..fed + step];
                let got = shared[s].feed(piece).unwrap().to_vec();
                assert_eq!(got, alone[s].feed(piece).unwrap(), "{config:?} stream {s}");
            }
        }
    }
}

/// The decoder's attention weights (what a server draws without Burn's model) are Burn's
/// `forward_with_attention` ones for every config, from one token to the whole block: every
/// block, every head, each row a distribution over the keys up to its own; one block asked for
/// alone gives the same numbers and nothing for the others; and reading them leaves the decoder
/// as fresh (its next feed gives a fresh decoder's logits).
#[test]
fn attention_maps_are_burns() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = common::init(&config, &device);
        let mut decoder = FusedDecoder::new(&gpt).unwrap();
        let stream = tokens(config.block_size, config.vocab_size);
        for seq in [1, 7, config.block_size] {
            let got = decoder.attention_maps(&stream[..seq], |_| true).unwrap();
            let last = config.n_layer - 1;
            let alone = decoder
                .attention_maps(&stream[..seq], |l| l == last)
                .unwrap();
            assert_eq!(alone[last], got[last], "{config:?}: the last block alone");
            assert!(alone[..last].iter().all(Vec::is_empty), "{config:?}");
            let ids: Vec<i64> = stream[..seq].iter().map(|&t| t.into()).collect();
            let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, seq]), &device);
            let (_, want) = gpt.forward_with_attention(ids).unwrap();
            assert_eq!(got.len(), want.len(), "{config:?}: blocks");
            for (l, (got, want)) in got.iter().zip(want).enumerate() {
                let want = want.into_data().try_to_vec::<f32>().unwrap();
                assert_eq!(got.len(), config.n_head, "{config:?}: heads");
                for (h, map) in got.iter().enumerate() {
                    let want = &want[h * seq * seq..(h + 1) * seq * seq];
                    let diff = map
                        .iter()
                        .zip(want)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        diff < 1e-5,
                        "{config:?} seq {seq} block {l} head {h}: {diff}"
                    );
                    for (i, row) in map.chunks_exact(seq).enumerate() {
                        assert!(row[i + 1..].iter().all(|&w| w == 0.0));
                        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
                    }
                }
            }
        }
        assert_eq!(decoder.cached(), 0);
        let fresh = FusedDecoder::new(&gpt).unwrap().feed(&stream[..5]).unwrap();
        assert_eq!(decoder.feed(&stream[..5]).unwrap(), fresh, "{config:?}");
    }
}
