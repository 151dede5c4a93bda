//! The fused decoder with its matrices in `Q8_0` (`WeightFormat::Q8_0`; `Q5_0` and `Q4_0` beside it where
//! said): logits within a stated bound of f32's on every architecture, streams of a batch
//! computed as alone, every row of a window scored as `Gpt::forward` scores it, and the bytes
//! a token reads.

mod common;

use burn::tensor::{Device, Int, Tensor, TensorData};
use common::{configs, seeded, tokens};
use tinygpt_model::{
    Decoder, FusedBatch, FusedDecoder, GenerateOptions, Gpt, GptConfig, Pass, WeightFormat,
    decoding::weight_bytes_per_token, generate,
};

/// Every decoder config at width 96 (whole blocks of 32 for every matrix), so each is
/// quantised.
fn int8_configs() -> Vec<GptConfig> {
    configs()
        .into_iter()
        .map(|c| c.with_n_embd(96).with_block_size(40))
        .collect()
}

fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

/// After a prompt and each of 20 tokens, int8 logits are within 3% of the largest f32 logit
/// (measured on these configs: 0.3% to 2.7%), four-bit ones (`Q4_0`: steps 16 times coarser)
/// within 40% (measured: 3.8% to 29%, on random weights), five-bit ones (`Q5_0`) within 25%
/// (measured: 1.6% to 18%), and not equal to them (the matrices were quantised).
#[test]
fn int8_logits_stay_close_to_f32() {
    let _seeded = seeded();
    let device = Device::flex();
    let formats = [
        (WeightFormat::Q8_0, 0.03),
        (WeightFormat::Q5_0, 0.25),
        (WeightFormat::Q4_0, 0.4),
    ];
    for (config, (format, bound)) in int8_configs()
        .into_iter()
        .flat_map(|c| formats.map(|f| (c.clone(), f)))
    {
        let gpt = common::init(&config, &device);
        let mut f32s = FusedDecoder::new(&gpt).unwrap();
        let mut int8 = FusedDecoder::with_weights(&gpt, format).unwrap();
        let stream = tokens(config.block_size, config.vocab_size);
        let (mut fed, mut worst, mut differs) = (0, 0f32, false);
        for step in [7].into_iter().chain(std::iter::repeat_n(1, 20)) {
            let want = f32s.feed(&stream[fed..fed + step]).unwrap();
            let got = int8.feed(&stream[fed..fed + step]).unwrap();
            fed += step;
            let diff = max_abs(
                &got.iter()
                    .zip(&want)
                    .map(|(a, b)| a - b)
                    .collect::<Vec<_>>(),
            );
            worst = worst.max(diff / max_abs(&want));
            differs |= got != want;
        }
        assert!(
            worst < bound,
            "{config:?} {format:?}: {worst} of the largest logit"
        );
        assert!(differs, "{config:?} {format:?}: gave f32's logits exactly");
    }
}

/// Whether this CPU and build multiply a prompt's rows by quantised matrices in integers
/// (AVX-512 with VNNI); elsewhere a prompt multiplies the dequantised weights in f32.
fn integer_prompts() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        cfg!(feature = "avx512") && has!("avx512f") && has!("avx512bw") && has!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// A prompt fed whole (its rows multiplied at once, in integers where the CPU has AVX-512
/// VNNI) gives the logits of its tokens fed one at a time within 1% of the largest (the
/// activations are quantised as a token's; only the order floats are summed in differs, and
/// a value that then rounds to the other side of an activation byte), in `Q8_0`, `Q5_0` and
/// `Q4_0`: measured at most 0.3%. The f32 product of the dequantised weights, which a CPU
/// without VNNI takes, is held to each format's bound against f32 above.
#[test]
fn a_prompt_fed_whole_gives_its_tokens_logits() {
    let _seeded = seeded();
    let device = Device::flex();
    if !integer_prompts() {
        eprintln!("skipped: a prompt's integer products (this CPU or build lacks AVX-512 VNNI)");
        return;
    }
    let mut worst = 0f32;
    for config in int8_configs() {
        let gpt = common::init(&config, &device);
        let prompt = tokens(32, config.vocab_size);
        for format in [WeightFormat::Q8_0, WeightFormat::Q5_0, WeightFormat::Q4_0] {
            let mut whole = FusedDecoder::with_weights(&gpt, format).unwrap();
            let mut one = FusedDecoder::with_weights(&gpt, format).unwrap();
            let got = whole.feed(&prompt).unwrap();
            let want = prompt
                .iter()
                .map(|&t| one.feed(&[t]).unwrap())
                .last()
                .unwrap();
            let diff: Vec<f32> = got.iter().zip(&want).map(|(a, b)| a - b).collect();
            let off = max_abs(&diff) / max_abs(&want);
            worst = worst.max(off);
            assert!(
                off < 0.01,
                "{config:?} {format:?}: {off} of the largest logit"
            );
        }
    }
    eprintln!("a prompt fed whole: at most {worst} of the largest logit from its tokens'");
}

/// Greedy decoding of a seeded model agrees with f32's for most tokens (random weights make the
/// top two logits close far more often than a trained model's do; measured: all 30).
#[test]
fn greedy_int8_mostly_agrees_with_f32() {
    let _seeded = seeded();
    let device = Device::flex();
    let config = int8_configs().remove(0);
    let gpt = common::init(&config, &device);
    let options = GenerateOptions {
        temperature: 0.0,
        max_new_tokens: 30,
        ..Default::default()
    };
    let mut f32s = FusedDecoder::new(&gpt).unwrap();
    let mut int8 = FusedDecoder::with_weights(&gpt, WeightFormat::Q8_0).unwrap();
    let want = generate(&mut f32s, &[1, 2, 3], &options, |_| {}).unwrap();
    let got = generate(&mut int8, &[1, 2, 3], &options, |_| {}).unwrap();
    let same = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
    assert!(same >= 20, "only the first {same} of 30 tokens agree");
}

/// A batch's streams with int8 matrices: each stream's logits bit for bit those of a decoder
/// alone, whatever else is in the step, however many streams step together (17: more than
/// the rows from which a prompt's products go to f32).
#[test]
fn int8_streams_are_computed_as_alone() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in int8_configs() {
        let gpt = common::init(&config, &device);
        let mut batch = FusedBatch::with_weights(&gpt, 2, WeightFormat::Q8_0).unwrap();
        let mut alone = FusedDecoder::with_weights(&gpt, WeightFormat::Q8_0).unwrap();
        let prompt = tokens(6, config.vocab_size);
        let want = alone.feed(&prompt).unwrap();
        let got = batch.step(&[(0, &prompt), (1, &prompt[..2])]).unwrap();
        assert_eq!(&got[..config.vocab_size], &want[..], "{config:?}");
        for token in [1, 5, 2] {
            let want = alone.feed(&[token]).unwrap();
            let got = batch.step(&[(1, &[token]), (0, &[token])]).unwrap();
            let v = config.vocab_size;
            assert_eq!(&got[v..2 * v], &want[..], "{config:?}");
        }
        let mut many = FusedBatch::with_weights(&gpt, 17, WeightFormat::Q8_0).unwrap();
        let feeds: Vec<(usize, &[u32])> = (0..17).map(|s| (s, &prompt[..2])).collect();
        many.step(&feeds).unwrap();
        let feeds: Vec<(usize, &[u32])> = (0..17).map(|s| (s, &prompt[2..3])).collect();
        let got = many.step(&feeds).unwrap();
        alone.clear();
        alone.feed(&prompt[..2]).unwrap();
        let want = alone.feed(&prompt[2..3]).unwrap();
        for s in 0..17 {
            let v = config.vocab_size;
            assert_eq!(&got[s * v..(s + 1) * v], &want[..], "{config:?} stream {s}");
        }
    }
}

/// Every row of a window scored by `window_logits` is `Gpt::forward`'s row (f32, to float
/// rounding), and with int8 or four-bit matrices within the same bound as a feed's.
#[test]
fn window_logits_are_every_rows_logits() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in int8_configs() {
        let gpt = common::init(&config, &device);
        let window = tokens(config.block_size, config.vocab_size);
        let burn = forward(&gpt, &window);
        let formats = [
            (WeightFormat::F32, 1e-4),
            (WeightFormat::Q8_0, 0.03),
            (WeightFormat::Q5_0, 0.25),
            (WeightFormat::Q4_0, 0.4),
        ];
        for (format, bound) in formats {
            let mut decoder = FusedDecoder::with_weights(&gpt, format).unwrap();
            let mut rows = 0;
            decoder
                .window_logits(&window, |r, logits| {
                    let want = &burn[r * config.vocab_size..(r + 1) * config.vocab_size];
                    let diff = logits
                        .iter()
                        .zip(want)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        diff <= bound * max_abs(want),
                        "{config:?} {format:?} row {r}"
                    );
                    rows += 1;
                })
                .unwrap();
            assert_eq!(rows, window.len());
        }
    }
}

/// Every row's logits of `Gpt::forward` over `context`, `[seq, vocab]`.
fn forward(gpt: &Gpt, context: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = context.iter().map(|&t| t.into()).collect();
    let ids = Tensor::<2, Int>::from_data(
        TensorData::new(ids, [1, context.len()]),
        &gpt.wte.weight.device(),
    );
    gpt.forward(ids, Pass::Infer)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap()
}

/// The bytes a token reads: 4 a weight in f32; 34 per 32 in int8 and 18 per 32 in four bits
/// where rows are whole blocks, f32 where not (width 30).
#[test]
fn bytes_per_token_count_the_matrices() {
    // Width 96, 2 layers, hidden 384, vocab 13 tied; c_attn 96×288, proj 96×96, fc 96×384,
    // mlp_proj 384×96, head 13×96.
    let config = common::small().with_n_embd(96);
    let weights = 2 * (96 * 288 + 96 * 96 + 96 * 384 + 384 * 96) + 13 * 96;
    let f32s = weight_bytes_per_token(&config, WeightFormat::F32);
    assert_eq!(f32s, 4 * weights);
    let int8 = weight_bytes_per_token(&config, WeightFormat::Q8_0);
    assert_eq!(int8, weights / 32 * 34);
    let four_bits = weight_bytes_per_token(&config, WeightFormat::Q4_0);
    assert_eq!(four_bits, weights / 32 * 18);
    let five_bits = weight_bytes_per_token(&config, WeightFormat::Q5_0);
    assert_eq!(five_bits, weights / 32 * 22);
    let narrow = common::small();
    assert_eq!(
        weight_bytes_per_token(&narrow, WeightFormat::Q8_0),
        weight_bytes_per_token(&narrow, WeightFormat::F32)
    );
}

/// The decoder's cache and positions are the same whatever its format: `Decoder`'s contract.
#[test]
fn int8_decoder_keeps_the_decoder_contract() {
    let _seeded = seeded();
    let gpt = int8_configs().remove(0).init(&Device::flex()).unwrap();
    let mut int8 = FusedDecoder::with_weights(&gpt, WeightFormat::Q8_0).unwrap();
    int8.feed(&[1, 2, 3]).unwrap();
    assert_eq!(int8.cached(), 3);
    int8.clear();
    let again = int8.feed(&[1, 2, 3]).unwrap();
    let mut fresh = FusedDecoder::with_weights(&gpt, WeightFormat::Q8_0).unwrap();
    assert_eq!(again, fresh.feed(&[1, 2, 3]).unwrap());
}

/// A sequence's products split over threads give the same logits bit for bit as on one, f32,
/// int8 and four bits, through the window, the cached tokens and the head (tied and untied): a token's
/// split by outputs, a prompt's chunk of 33 rows by rows (11 a thread, each fewer than a
/// product needs to run as f32 products of the dequantised weights, as the whole chunk does).
#[test]
fn threads_change_no_logit() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in int8_configs() {
        let gpt = common::init(&config, &device);
        let stream = tokens(40, config.vocab_size);
        let formats = [
            WeightFormat::F32,
            WeightFormat::Q8_0,
            WeightFormat::Q5_0,
            WeightFormat::Q4_0,
        ];
        for format in formats {
            let mut one = FusedDecoder::with_weights(&gpt, format).unwrap();
            let mut three = FusedDecoder::with_weights(&gpt, format)
                .unwrap()
                .with_threads(3);
            let steps = [
                &stream[..33],
                &stream[33..34],
                &stream[34..35],
                &stream[35..40],
            ];
            for step in steps {
                assert_eq!(three.feed(step).unwrap(), one.feed(step).unwrap());
            }
        }
    }
}

/// An int8 decoder's attention maps (what `serve --weights q8_0` draws) are its own: each row
/// a distribution over the keys up to its own, within 0.05 of the f32 decoder's (measured on
/// these configs: at most 0.010), and not equal to them (the queries and keys came from int8
/// products).
#[test]
fn int8_attention_maps_are_the_int8_models() {
    let _seeded = seeded();
    let device = Device::flex();
    for config in int8_configs() {
        let gpt = common::init(&config, &device);
        let seq = 12;
        let stream = tokens(seq, config.vocab_size);
        let want = FusedDecoder::new(&gpt)
            .unwrap()
            .attention_maps(&stream, |_| true);
        let int8 = FusedDecoder::with_weights(&gpt, WeightFormat::Q8_0).unwrap();
        let got = int8.share().attention_maps(&stream, |_| true);
        let (want, got) = (want.unwrap(), got.unwrap());
        let (mut worst, mut differs) = (0f32, false);
        for (got, want) in got.iter().flatten().zip(want.iter().flatten()) {
            for (i, row) in got.chunks_exact(seq).enumerate() {
                assert!(row[i + 1..].iter().all(|&w| w == 0.0), "{config:?}");
                assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{config:?}");
            }
            worst = got
                .iter()
                .zip(want)
                .fold(worst, |m, (a, b)| m.max((a - b).abs()));
            differs |= got != want;
        }
        assert!(worst < 0.05, "{config:?}: {worst}");
        assert!(differs, "{config:?}: int8 gave f32's maps exactly");
    }
}
