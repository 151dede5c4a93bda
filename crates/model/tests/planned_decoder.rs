//! The fused decoder with each matrix stored as a [`WeightPlan`] says (a GGUF file's types,
//! range of rows by range): a plan of one format is that format bit for bit; a matrix cut into
//! ranges of the same format gives the same logits token by token bit for bit (each output row
//! is computed as alone), on one thread or three, and a prompt's within float rounding; a plan
//! of mixed formats stays within the coarser one's bound of f32; a plan that does not fit the
//! model is an error.

mod common;

use std::sync::Arc;

use burn::tensor::Device;
use common::{configs, seeded, tokens};
use tinygpt_model::{
    Decoder, FusedDecoder, FusedError, GptConfig, Matrices, Segment, WeightFormat, WeightPlan,
};

/// Every decoder config at width 96, so each matrix is whole blocks of 32.
fn wide_configs() -> Vec<GptConfig> {
    configs()
        .into_iter()
        .map(|c| c.with_n_embd(96).with_block_size(40))
        .collect()
}

/// The logits of a prompt of 33 tokens (many rows at once) and then of 3 single tokens.
fn logits(decoder: &mut FusedDecoder, stream: &[u32]) -> Vec<Vec<f32>> {
    [
        &stream[..33],
        &stream[33..34],
        &stream[34..35],
        &stream[35..36],
    ]
    .iter()
    .map(|step| decoder.feed(step).unwrap())
    .collect()
}

/// `segments` with each cut in two where it holds more than one row: the first third in
/// `first`, the rest in `rest`.
fn cut(segments: &[Segment], first: WeightFormat, rest: WeightFormat) -> Vec<Segment> {
    segments
        .iter()
        .flat_map(|s| match s.rows {
            0 | 1 => vec![s.clone()],
            n => vec![
                Segment::quantised(n / 3, first),
                Segment::quantised(n - n / 3, rest),
            ],
        })
        .collect()
}

/// Every matrix of `plan` cut as [`cut`] does.
fn cut_all(plan: &WeightPlan, first: WeightFormat, rest: WeightFormat) -> WeightPlan {
    let mut plan = plan.clone();
    for b in &mut plan.blocks {
        for m in [&mut b.qkv, &mut b.attn_proj, &mut b.fc, &mut b.mlp_proj] {
            *m = cut(m, first, rest);
        }
    }
    plan.head = cut(&plan.head, first, rest);
    plan
}

fn planned(plan: WeightPlan) -> Matrices {
    Matrices::Planned(Arc::new(plan))
}

#[test]
fn a_plan_of_one_format_is_that_format_and_cutting_it_changes_no_logit() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in wide_configs() {
        let gpt = common::init(&config, &device);
        let stream = tokens(36, config.vocab_size);
        for format in [WeightFormat::Q8_0, WeightFormat::Q5_0, WeightFormat::Q4_0] {
            let want = logits(
                &mut FusedDecoder::with_weights(&gpt, format).unwrap(),
                &stream,
            );
            let plan = WeightPlan::uniform(&gpt, format).unwrap();
            let mut one = FusedDecoder::with_weights(&gpt, planned(plan.clone())).unwrap();
            assert_eq!(logits(&mut one, &stream), want, "{format:?}, one segment");
            let cut = cut_all(&plan, format, format);
            assert!(cut.blocks[0].qkv.len() == 2, "cut in two");
            let mut threads = FusedDecoder::with_weights(&gpt, planned(cut.clone()))
                .unwrap()
                .with_threads(3);
            let tokens_alone = |decoder: &mut FusedDecoder| -> Vec<Vec<f32>> {
                stream[..6]
                    .iter()
                    .map(|&t| decoder.feed(&[t]).unwrap())
                    .collect()
            };
            let mut whole = FusedDecoder::with_weights(&gpt, format).unwrap();
            assert_eq!(
                tokens_alone(&mut threads),
                tokens_alone(&mut whole),
                "{format:?}, cut, 3 threads"
            );
            // A prompt's rows multiply the dequantised weights in f32, a range at a time: the
            // blocked product may sum a narrower range in another order.
            let mut prompt = FusedDecoder::with_weights(&gpt, planned(cut)).unwrap();
            for (got, want) in logits(&mut prompt, &stream).iter().zip(&want) {
                for (a, b) in got.iter().zip(want) {
                    assert!(
                        (a - b).abs() <= 1e-4 * b.abs().max(1.0),
                        "{format:?}: {a} {b}"
                    );
                }
            }
        }
    }
}

/// Q5_0 rows above Q8_0 rows in every matrix: within `Q5_0`'s bound of f32's logits (the
/// uniform decoder tests': 25% of the largest), not equal to either uniform format's, and the
/// same on one thread and three.
#[test]
fn a_plan_of_mixed_formats_decodes_each_range_its_own_way() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in wide_configs() {
        let gpt = common::init(&config, &device);
        let stream = tokens(36, config.vocab_size);
        let plan = WeightPlan::uniform(&gpt, WeightFormat::Q8_0).unwrap();
        let mixed = cut_all(&plan, WeightFormat::Q5_0, WeightFormat::Q8_0);
        let got = logits(
            &mut FusedDecoder::with_weights(&gpt, planned(mixed.clone())).unwrap(),
            &stream,
        );
        let threads = logits(
            &mut FusedDecoder::with_weights(&gpt, planned(mixed))
                .unwrap()
                .with_threads(3),
            &stream,
        );
        assert_eq!(threads, got, "{config:?}: threads");
        let f32s = logits(&mut FusedDecoder::new(&gpt).unwrap(), &stream);
        for format in [WeightFormat::Q8_0, WeightFormat::Q5_0] {
            let uniform = logits(
                &mut FusedDecoder::with_weights(&gpt, format).unwrap(),
                &stream,
            );
            assert_ne!(got, uniform, "{config:?}: {format:?}");
        }
        for (got, want) in got.iter().zip(&f32s) {
            let largest = want.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = got
                .iter()
                .zip(want)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(worst < 0.25 * largest, "{config:?}: {worst} of {largest}");
        }
    }
}

#[test]
fn a_plan_that_does_not_fit_the_model_is_an_error() {
    let _seeded = seeded();
    let config = wide_configs().remove(0);
    let gpt = common::init(&config, &Device::flex());
    let plan = WeightPlan::uniform(&gpt, WeightFormat::Q8_0).unwrap();
    let mut short = plan.clone();
    short.blocks.pop();
    let mut rows = plan.clone();
    rows.blocks[0].qkv[0].rows += 1;
    for (bad, why) in [(short, "blocks"), (rows, "rows")] {
        match FusedDecoder::with_weights(&gpt, planned(bad)) {
            Err(e @ FusedError::Storage(_)) => assert!(e.to_string().contains(why), "{e}"),
            other => panic!("{why}: {:?}", other.err()),
        }
    }
}
