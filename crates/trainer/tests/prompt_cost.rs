//! What a prompt costs a GPU server: `serve`'s streams on wgpu (lavapipe in CI) read their
//! prompts through one step of fixed shape, a chunk of tokens a row, recorded once and
//! replayed like the step of single tokens; so once it has run, a prompt of a length never
//! seen compiles (nearly) nothing and launches only its inputs' uploads, and several prompts
//! go in together; their logits are the ones each stream gets alone. One sequence's decoder
//! (`generate`) reads its prompt through the same chunks. Feeding the same prompts in one
//! forward pass of the prompt's own length (the way both read them before) is caught
//! compiling kernels for the new lengths.
//! One test, so no other test's kernels run meanwhile: the counts are the whole process's
//! ("nearly": see `token_cost.rs`).

use tinygpt::backend::Backend;
use tinygpt::token_cost::{count, warm_up};
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{BatchDecoder, Decoder, Gpt, GptBatch, GptConfig, decoding::DecodeStep};

const VOCAB: usize = 40;

/// `len` tokens of a text that differs from stream to stream.
fn prompt(stream: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7 + stream * 13 + 3) % VOCAB) as u32)
        .collect()
}

fn to_rounding(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-5 * scale,
        "{what}: max diff {diff}, scale {scale}"
    );
}

#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn a_gpu_server_reads_prompts_of_any_length_through_one_step() {
    let device = Backend::Wgpu.placement().unwrap().device;
    let gpt = GptConfig::new(VOCAB)
        .with_block_size(96)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(32)
        .init(&device)
        .unwrap();
    assert_eq!(gpt.kernels(), Kernels::Cube);
    for way in [DecodeStep::Step, DecodeStep::Captured] {
        prompts_through_the_rows(&gpt, way);
    }

    // One sequence's decoder (`generate`) reads a prompt through the same chunk step, and
    // `DecodeStep::Forward` in one forward pass of the prompt's own length: each length its
    // own shapes. The same prompts, each checked against the forward pass to rounding.
    for way in [DecodeStep::Step, DecodeStep::Forward] {
        let mut alone = gpt.decoder_with(way);
        let ((), warm) = warm_up(|| {
            alone.feed(&prompt(0, 5)).map(drop)?;
            alone.clear();
            alone.feed(&prompt(1, 40)).map(drop)?;
            Ok(())
        })
        .unwrap();
        let mut got = Vec::new();
        let cost = count(&warm, || {
            for n in [3, 9, 70, 17] {
                alone.clear();
                got.push(alone.feed(&prompt(2, n))?);
            }
            Ok(4)
        })
        .unwrap();
        eprintln!("one sequence, {way:?}: {cost:?}");
        match way {
            DecodeStep::Forward => assert!(cost.compiles_after_warmup >= 5, "{cost:?}"),
            _ => {
                assert!(cost.compiles_after_warmup <= 2, "{way:?}: {cost:?}");
                assert_eq!(cost.host_reads_per_token, 1.0, "{way:?}: {cost:?}");
                let mut forward = gpt.decoder_with(DecodeStep::Forward);
                for (n, logits) in [3, 9, 70, 17].into_iter().zip(&got) {
                    forward.clear();
                    let want = forward.feed(&prompt(2, n)).unwrap();
                    to_rounding(logits, &want, &format!("{way:?}, a prompt of {n}"));
                }
            }
        }
    }
}

/// Prompts and single tokens of three streams through a batch whose steps run `way`: after a
/// warm-up, new prompt lengths compile (nearly) nothing, the host reads once for the single
/// tokens and once where prompts end, and each stream's logits are its own alone.
fn prompts_through_the_rows(gpt: &Gpt, way: DecodeStep) {
    let mut batch = GptBatch::with_step(gpt, 3, way);
    // Steps of prompts (stream, length) and single tokens: prompts of one chunk and of several,
    // shorter and longer ones going in together, a stream decoding while others read theirs.
    // Each fed stream's logits are kept with its length, to check after the counting.
    let mut seen: Vec<(usize, usize, Vec<f32>)> = Vec::new();
    let mut step = |feeds: &[(usize, usize)], batch: &mut GptBatch| {
        let fed: Vec<(usize, Vec<u32>)> = feeds
            .iter()
            .map(|&(s, n)| {
                let past = batch.cached(s);
                (s, prompt(s, past + n)[past..].to_vec())
            })
            .collect();
        let refs: Vec<(usize, &[u32])> = fed.iter().map(|(s, t)| (*s, &t[..])).collect();
        let logits = batch.step(&refs).unwrap().to_vec();
        for (row, (s, _)) in logits.chunks_exact(VOCAB).zip(&fed) {
            seen.push((*s, batch.cached(*s), row.to_vec()));
        }
    };
    let ((), warm) = warm_up(|| {
        step(&[(0, 5)], &mut batch);
        step(&[(0, 1), (1, 40)], &mut batch);
        Ok(())
    })
    .unwrap();
    let fed = count(&warm, || {
        step(&[(0, 1), (1, 1), (2, 3)], &mut batch);
        step(&[(0, 1), (1, 9), (2, 70)], &mut batch);
        batch.clear(0);
        step(&[(0, 17), (1, 1), (2, 1)], &mut batch);
        Ok(5)
    })
    .unwrap();
    eprintln!("{way:?}, prompts through the chunk step: {fed:?}");
    assert!(fed.compiles_after_warmup <= 2, "{way:?}: {fed:?}");
    // One read for a step's single tokens and one for each chunk where prompts end: 2 + 3 + 2
    // (stream 2's 70 tokens end in the third chunk, stream 1's 9 in the first).
    assert_eq!(fed.host_reads_per_token * 5.0, 7.0, "{way:?}: {fed:?}");
    // Recorded, each of the eight steps (five chunks, three of single tokens) replays as one
    // graph: only the inputs' uploads are launched (about a hundred kernels a step without).
    if way == DecodeStep::Captured {
        assert!(fed.launches_per_token * 5.0 <= 3.0 * 8.0, "{fed:?}");
    }
    // Each stream alone: its whole text so far through the model's own decoder.
    assert_eq!(seen.len(), 12);
    for (s, len, got) in &seen {
        let mut alone = gpt.decoder_with(DecodeStep::Forward);
        let want = alone.feed(&prompt(*s, *len)).unwrap();
        to_rounding(got, &want, &format!("stream {s} after {len} tokens"));
    }
}
