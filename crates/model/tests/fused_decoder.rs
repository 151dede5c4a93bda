//! The fused CPU decoder against Burn's `Gpt::forward` and `Gpt::generate`: the same logits at
//! every step of a KV-cached decode, the same tokens while the window slides, typed errors.

mod common;

use burn::tensor::{Device, Int, Tensor, TensorData};
use common::seeded;
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{
    Continuation, Decoder, FusedBatch, FusedDecoder, GenerateOptions, Gpt, GptConfig, ModelError,
    PREFILL_CHUNK, generate,
};

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

/// Streams decoded together in a [`FusedBatch`] get, at every step, exactly (bit for bit) the
/// logits each gets alone in a [`FusedDecoder`] fed the same: streams join late, one starts from
/// a one-token prompt, one is cleared and rebuilt from a window while the others decode.
#[test]
fn a_batch_gives_each_stream_the_logits_it_gets_alone() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in configs() {
        let gpt = config.init(&device).unwrap();
        let vocab = config.vocab_size;
        let mut batch = FusedBatch::new(&gpt, 3).unwrap();
        let mut alone: Vec<FusedDecoder> =
            (0..3).map(|_| FusedDecoder::new(&gpt).unwrap()).collect();
        let text: Vec<Vec<u32>> = (0..3)
            .map(|s| tokens(config.block_size + 7 * s, vocab)[7 * s..].to_vec())
            .collect();
        // (step, stream, tokens fed): each stream's first feed is its prompt.
        let mut at = [0usize; 3];
        for step in 0..14 {
            let mut feeds: Vec<(usize, Vec<u32>)> = Vec::new();
            for (s, (joins, prompt)) in [(0, 5), (2, 1), (3, 7)].into_iter().enumerate() {
                if step < joins {
                    continue;
                }
                let n = if step == joins { prompt } else { 1 };
                if s == 1 && step == 9 {
                    // A rebuild: the cache emptied, the last 4 tokens fed again as a window.
                    batch.clear(1);
                    alone[1].clear();
                    feeds.push((1, text[1][at[1] - 3..=at[1]].to_vec()));
                    at[1] += 1;
                    continue;
                }
                feeds.push((s, text[s][at[s]..at[s] + n].to_vec()));
                at[s] += n;
            }
            let refs: Vec<(usize, &[u32])> = feeds.iter().map(|(s, t)| (*s, &t[..])).collect();
            let logits = batch.step(&refs).unwrap().to_vec();
            for (i, (s, fed)) in feeds.iter().enumerate() {
                let want = alone[*s].feed(fed).unwrap();
                assert_eq!(
                    &logits[i * vocab..(i + 1) * vocab],
                    &want[..],
                    "{config:?}: step {step}, stream {s}"
                );
                assert_eq!(batch.cached(*s), alone[*s].cached());
            }
        }
    }
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
        let gpt = config.init(&device).unwrap();
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

/// Generations advanced step by step through one batch ([`Continuation`]) write the tokens
/// `generate` writes for each alone, with the same seeds: sampling, penalties, a stop sequence,
/// and the window sliding past `block_size` (exactly, and with the context shift).
#[test]
fn batched_generations_write_what_each_writes_alone() {
    let _seeded = seeded();
    let config = GptConfig::new(13)
        .with_block_size(16)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32);
    let gpt = config.init(&Device::flex()).unwrap();
    // Two runs may end at a stop sequence; the other two write 40 tokens, past the window.
    let options = |seed: u64, shift: bool, stop: Vec<Vec<u32>>| GenerateOptions {
        max_new_tokens: 40,
        temperature: 1.0,
        top_k: Some(8),
        seed,
        context_shift: shift,
        frequency_penalty: 0.3,
        stop,
        ..GenerateOptions::default()
    };
    let runs: Vec<(Vec<u32>, GenerateOptions)> = (0..4)
        .map(|i| {
            let stop = if i < 2 { vec![vec![3, 4]] } else { Vec::new() };
            (tokens(3 + 4 * i, 13), options(i as u64, i % 2 == 1, stop))
        })
        .collect();
    let want: Vec<Vec<u32>> = runs
        .iter()
        .map(|(prompt, o)| {
            generate(&mut FusedDecoder::new(&gpt).unwrap(), prompt, o, |_| {}).unwrap()
        })
        .collect();
    let mut batch = FusedBatch::new(&gpt, runs.len()).unwrap();
    let mut live: Vec<(usize, Continuation)> = runs
        .iter()
        .enumerate()
        .map(|(s, (prompt, o))| (s, Continuation::new(prompt, o, 16, 13).unwrap()))
        .collect();
    let mut got = vec![Vec::new(); runs.len()];
    while !live.is_empty() {
        let feeds: Vec<(usize, Vec<u32>)> = live
            .iter_mut()
            .map(|(s, c)| {
                let feed = c.feed(batch.cached(*s));
                if feed.clear {
                    batch.clear(*s);
                }
                (*s, c.tokens()[feed.from..].to_vec())
            })
            .collect();
        let refs: Vec<(usize, &[u32])> = feeds.iter().map(|(s, t)| (*s, &t[..])).collect();
        let logits = batch.step(&refs).unwrap().to_vec();
        for (i, (_, c)) in live.iter_mut().enumerate() {
            c.accept(&logits[i * 13..(i + 1) * 13]).unwrap();
        }
        live.retain_mut(|(s, c)| {
            if c.finished().is_none() {
                return true;
            }
            got[*s] = c.sampled().iter().map(|t| t.id).collect();
            false
        });
    }
    assert_eq!(got, want);
    assert!(want[2..].iter().all(|w| w.len() == 40));
}
