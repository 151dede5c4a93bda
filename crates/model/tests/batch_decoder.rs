//! Many streams decoded at once ([`BatchDecoder`]): on the fused CPU decoder ([`FusedBatch`])
//! each stream gets, bit for bit, what it gets alone; on Burn's backends ([`GptBatch`]) the
//! same to float rounding, and the same tokens.

mod common;

use burn::module::Module;
use burn::tensor::Device;
use common::{configs, seeded, sliding, tokens};
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{
    BatchDecoder, Decoder, FusedBatch, FusedDecoder, GenerateOptions, Gpt, GptBatch, GptConfig,
    decoding::Replay, generate, generate_batch,
};

/// A generation to run: its prompt and its sampler's settings.
type Run = (Vec<u32>, GenerateOptions);

/// Judges one step's logits of a stream against what it gets alone.
type Same<'a> = &'a dyn Fn(&[f32], &[f32], &str);

/// Three streams fed through `batch` and each through its own decoder in `alone`: they join
/// late (at steps 0, 2 and 3, with prompts of 5, 1 and 7 tokens), stream 0 sits out steps 6
/// and 7 (a stalled client), and stream 1 is cleared and rebuilt from a 4-token window at step
/// 9 while the others decode. `same` judges every stream's logits at every step.
fn join_late_and_rebuild(
    batch: &mut dyn BatchDecoder,
    alone: &mut [Box<dyn Decoder + '_>],
    config: &GptConfig,
    same: Same,
) {
    let vocab = config.vocab_size;
    let text: Vec<Vec<u32>> = (0..3)
        .map(|s| tokens(config.block_size + 7 * s, vocab)[7 * s..].to_vec())
        .collect();
    let mut at = [0usize; 3];
    for step in 0..14 {
        let mut feeds: Vec<(usize, Vec<u32>)> = Vec::new();
        for (s, (joins, prompt)) in [(0, 5), (2, 1), (3, 7)].into_iter().enumerate() {
            if step < joins || (s == 0 && (6..8).contains(&step)) {
                continue;
            }
            let n = if step == joins { prompt } else { 1 };
            if s == 1 && step == 9 {
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
            let what = format!("{config:?}: step {step}, stream {s}");
            same(&logits[i * vocab..(i + 1) * vocab], &want, &what);
            assert_eq!(batch.cached(*s), alone[*s].cached(), "{what}");
        }
    }
}

fn bit_for_bit(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got, want, "{what}");
}

fn to_rounding(got: &[f32], want: &[f32], what: &str) {
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        diff <= 1e-5 * scale,
        "{what}: max diff {diff} vs scale {scale}"
    );
}

/// Streams decoded together in a [`FusedBatch`] get exactly (bit for bit) the logits each gets
/// alone in a [`FusedDecoder`] fed the same.
#[test]
fn a_fused_batch_gives_each_stream_the_logits_it_gets_alone() {
    let _seeded = seeded();
    for config in configs() {
        let gpt = common::init(&config, &Device::flex());
        let mut batch = FusedBatch::new(&gpt, 3).unwrap();
        let mut alone: Vec<Box<dyn Decoder>> = (0..3)
            .map(|_| Box::new(FusedDecoder::new(&gpt).unwrap()) as Box<dyn Decoder>)
            .collect();
        join_late_and_rebuild(&mut batch, &mut alone, &config, &bit_for_bit);
    }
}

/// Streams decoded together in a [`GptBatch`] (Burn's tensor ops, the single tokens of a step
/// in one [`Gpt::forward_rows`](tinygpt_model::Gpt::forward_rows)) get the logits each gets
/// alone from [`Gpt::decoder`](tinygpt_model::Gpt::decoder), to float rounding, for every
/// architecture.
#[test]
fn a_burn_batch_gives_each_stream_the_logits_it_gets_alone() {
    let _seeded = seeded();
    for config in configs() {
        burn_batch(&common::init(&config, &Device::flex()), &config);
    }
}

/// The same on wgpu, where the caches have a fixed capacity: the shorter rows' empty rows of
/// the cache are hidden as well.
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn a_burn_batch_on_wgpu_gives_each_stream_the_logits_it_gets_alone() {
    let device = common::wgpu_device_of_two();
    let all = configs();
    for config in [&all[0], &all[8]] {
        let gpt = common::drawn_on_flex(config)
            .to_device(&device)
            .with_kernels(Kernels::for_device(&device));
        burn_batch(&gpt, config);
    }
}

fn burn_batch(gpt: &Gpt, config: &GptConfig) {
    let mut batch = GptBatch::new(gpt, 3);
    let mut alone: Vec<Box<dyn Decoder>> = (0..3)
        .map(|_| Box::new(gpt.decoder()) as Box<dyn Decoder>)
        .collect();
    join_late_and_rebuild(&mut batch, &mut alone, config, &to_rounding);
}

/// Four generations of `batch`'s model stepped together ([`generate_batch`]): sampling,
/// penalties, a stop sequence, and the window sliding past `block_size` (exactly, and with the
/// context shift). Returns each one's tokens, and the options `generate` alone needs to write
/// them.
fn generations(batch: &mut dyn BatchDecoder) -> (Vec<Vec<u32>>, Vec<Run>) {
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
    let runs: Vec<Run> = (0..4)
        .map(|i| {
            let stop = if i < 2 { vec![vec![3, 4]] } else { Vec::new() };
            (tokens(3 + 4 * i, 13), options(i as u64, i % 2 == 1, stop))
        })
        .collect();
    let got = generate_batch(batch, &runs).unwrap();
    (got, runs)
}

/// Generations through one batch write the tokens `generate` writes for each alone, with the
/// same seeds: on the fused decoder and on Burn's.
#[test]
fn batched_generations_write_what_each_writes_alone() {
    let _seeded = seeded();
    let gpt = sliding().init(&Device::flex()).unwrap();
    let (got, runs) = generations(&mut FusedBatch::new(&gpt, 4).unwrap());
    let alone = |decoder: &mut dyn Decoder, (prompt, o): &Run| {
        generate(decoder, prompt, o, |_| {}).unwrap()
    };
    let want: Vec<Vec<u32>> = runs
        .iter()
        .map(|run| alone(&mut FusedDecoder::new(&gpt).unwrap(), run))
        .collect();
    assert_eq!(got, want, "fused");
    assert!(want[2..].iter().all(|w| w.len() == 40));

    let (got, runs) = generations(&mut GptBatch::new(&gpt, 4));
    let want: Vec<Vec<u32>> = runs
        .iter()
        .map(|run| alone(&mut gpt.decoder(), run))
        .collect();
    assert_eq!(got, want, "Burn");
}

/// The same on wgpu, where every stream is a row of one cache per layer and each step feeds
/// all rows at once (the rows with nothing to feed sit out), recorded once and replayed: each
/// generation writes the tokens
/// the fused decoder writes for it alone (the same weights; the logits differ by rounding only,
/// which these draws do not straddle).
#[test]
#[cfg_attr(
    no_wgpu,
    ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
)]
fn batched_generations_on_wgpu_write_what_each_writes_alone() {
    let gpt = common::drawn_on_flex(&sliding());
    let wgpu = common::wgpu_device_of_two();
    let on_wgpu = gpt
        .clone()
        .to_device(&wgpu)
        .with_kernels(Kernels::for_device(&wgpu));
    assert_eq!(on_wgpu.kernels(), Kernels::Cube);
    // As `serve` runs it: on a worker thread, on a copy of the weights of its own; the step of
    // all rows is recorded there and replays as one graph.
    let (got, runs, replays) = std::thread::scope(|scope| {
        let worker = scope.spawn(|| {
            let own = on_wgpu.copied_here();
            let mut batch = GptBatch::new(&own, 4);
            let (got, runs) = generations(&mut batch);
            (got, runs, batch.replays())
        });
        worker.join().unwrap()
    });
    assert_eq!(replays, Some(Replay::Graph));
    let want: Vec<Vec<u32>> = runs
        .iter()
        .map(|(prompt, o)| {
            let mut alone = FusedDecoder::new(&gpt).unwrap();
            generate(&mut alone, prompt, o, |_| {}).unwrap()
        })
        .collect();
    assert_eq!(got, want);
}
