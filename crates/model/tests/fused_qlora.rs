//! LoRA on a quantised base (`[lora] base = "q8_0"`, and `"q4_k"`: `Q4_K`, or `Q5_0` where
//! a matrix's inputs are not whole super-blocks of 256): the model's block matrices are their
//! rounding to those blocks and nothing else changes; the fused CPU engine holds them in the
//! blocks (the bytes it says), computes Burn's loss and adapter gradients from them, the same
//! with activation checkpointing bit for bit, sizes its buffers as the estimate says, and lends
//! the base out and takes it back unchanged.

mod common;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Int, Tensor, TensorData};
use common::lora::{adapted, batch, check, without_adapters};
use common::{last_logits as burn_logits, seeded};
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{
    AdamWSettings, BaseWeights, BlockType, Decoder, FusedCpu, Gpt, GptConfig, LoraConfig, LrRatios,
    ParamLayout, TokenBatch, decoding::q8_0_block, names::BlockSlot, names::Slot,
};

/// The quantised bases.
const BASES: [BaseWeights; 2] = [BaseWeights::Q8_0, BaseWeights::Q4K];

/// Adapters of `rank` on every matrix, the base in `base`.
fn held(rank: usize, base: BaseWeights) -> LoraConfig {
    LoraConfig {
        base,
        ..LoraConfig::new(rank)
    }
}

/// The blocks `base` holds a matrix of `n_in` inputs in (`None`: f32).
fn kind(base: BaseWeights, n_in: usize) -> Option<BlockType> {
    let fits = |k: BlockType| n_in.is_multiple_of(k.values()).then_some(k);
    match base {
        BaseWeights::F32 => None,
        BaseWeights::Q8_0 => fits(BlockType::Q8_0),
        BaseWeights::Q4K => fits(BlockType::Q4_K).or_else(|| fits(BlockType::Q5_0)),
    }
}

/// Models whose matrices' inputs are whole blocks of 32: the classic parts at width 64; the
/// modern parts (grouped heads, QK-norm, rotary positions, SwiGLU, untied head, soft-cap); and
/// an MLP 48 wide, whose `mlp_proj` stays f32 (its inputs are not whole blocks).
fn configs() -> Vec<GptConfig> {
    let classic = GptConfig::new(13)
        .with_block_size(24)
        .with_n_layer(2)
        .with_n_head(2)
        .with_n_embd(64);
    let modern = classic
        .clone()
        .with_n_head(4)
        .with_n_kv_head(Some(2))
        .with_position(Position::Rope)
        .with_norm(Norm::Rms)
        .with_qk_norm(true)
        .with_mlp(Mlp::SwiGlu)
        .with_bias(false)
        .with_tie_embeddings(false)
        .with_logit_softcap(3.0);
    let odd_mlp = classic.clone().with_mlp_hidden(Some(48));
    vec![classic, modern, odd_mlp]
}

/// The models for `base`: for `q4_k` also one 256 wide with an MLP 512 wide, whose matrices
/// are whole super-blocks (`Q4_K`; the others' are `Q5_0`).
fn configs_for(base: BaseWeights) -> Vec<GptConfig> {
    let mut all = configs();
    if base == BaseWeights::Q4K {
        let wide = all[1].clone().with_n_embd(256).with_mlp_hidden(Some(512));
        all.push(wide);
    }
    all
}

/// `w [n_in, n_out]` rounded to `base`'s blocks along each output's inputs, from the public
/// quantisers (what `export --dtype q8_0|q4_k` writes).
fn rounded(w: &[f32], n_in: usize, n_out: usize, base: BaseWeights) -> Vec<f32> {
    let kind = kind(base, n_in).expect("a held matrix");
    if kind != BlockType::Q8_0 {
        // Rounded until the blocks give the values back (once, but for a rare row).
        let mut rows: Vec<f32> = (0..w.len())
            .map(|k| w[(k % n_in) * n_out + k / n_in])
            .collect();
        loop {
            let mut back = vec![0.0; w.len()];
            kind.decode(&kind.encode(&rows), &mut back);
            if back == rows {
                break;
            }
            rows = back;
        }
        return (0..w.len())
            .map(|k| rows[(k % n_out) * n_in + k / n_out])
            .collect();
    }
    let mut out = w.to_vec();
    for j in 0..n_out {
        for i0 in (0..n_in).step_by(32) {
            let x: [f32; 32] = std::array::from_fn(|k| w[(i0 + k) * n_out + j]);
            let (d, q) = q8_0_block(&x);
            for (k, q) in q.iter().enumerate() {
                out[(i0 + k) * n_out + j] = f32::from(*q) * d.to_f32();
            }
        }
    }
    out
}

/// Each parameter's values by slot.
fn by_slot(gpt: &Gpt) -> Vec<(Slot, Vec<usize>, Vec<f32>)> {
    let layout = ParamLayout::of(gpt);
    let flat = layout.flatten(gpt).into_data().try_to_vec::<f32>().unwrap();
    let entries = layout.entries().iter();
    entries
        .map(|e| (e.slot, e.shape.clone(), flat[e.range()].to_vec()))
        .collect()
}

/// Whether `slot` is one of a block's matrices that `base` holds quantised.
fn held_matrix(slot: Slot, shape: &[usize], base: BaseWeights) -> bool {
    let matrix = matches!(
        slot,
        Slot::Block(
            _,
            BlockSlot::AttnWeight
                | BlockSlot::AttnProjWeight
                | BlockSlot::FcWeight
                | BlockSlot::MlpProjWeight
        )
    );
    matrix && kind(base, shape[0]).is_some()
}

fn tokens<'a>(ids: &'a (Vec<i64>, Vec<i64>)) -> TokenBatch<'a> {
    TokenBatch {
        inputs: &ids.0,
        targets: &ids.1,
        batch: 3,
        seq: 12,
    }
}

#[test]
fn the_base_matrices_are_rounded_and_nothing_else_changes() {
    let _seeded = seeded();
    for (base_weights, config) in BASES
        .iter()
        .flat_map(|&b| configs_for(b).into_iter().map(move |c| (b, c)))
    {
        let base = common::init(&config, &Device::flex().autodiff());
        let want = by_slot(&base);
        let gpt = base.with_lora(&held(2, base_weights)).unwrap();
        assert_eq!(gpt.lora_base(), base_weights);
        let got = by_slot(&gpt);
        let mut rounded_matrices = 0;
        for (slot, shape, values) in &want {
            let (_, _, now) = got.iter().find(|(s, ..)| s == slot).expect("kept");
            if held_matrix(*slot, shape, base_weights) {
                let want = rounded(values, shape[0], shape[1], base_weights);
                assert!(now == &want, "{slot:?}");
                assert!(now != values, "{slot:?} is rounded");
                rounded_matrices += 1;
            } else {
                assert!(now == values, "{slot:?} is kept");
            }
        }
        let whole = if config.mlp_width().is_multiple_of(32) {
            4
        } else {
            3
        };
        assert_eq!(rounded_matrices, whole * config.n_layer, "{config:?}");
        assert_eq!(gpt.merge_lora().lora_base(), BaseWeights::F32);
    }
}

#[test]
fn the_engine_holds_the_base_in_its_blocks() {
    let _seeded = seeded();
    for (base, config) in BASES
        .iter()
        .flat_map(|&b| configs_for(b).into_iter().map(move |c| (b, c)))
    {
        let q = adapted(&config, &held(2, base));
        let f32 = adapted(&config, &LoraConfig::new(2));
        let (q_bytes, f32_bytes) = (
            FusedCpu::new(&q, 1).unwrap().weight_bytes() as u64,
            FusedCpu::new(&f32, 1).unwrap().weight_bytes() as u64,
        );
        assert_eq!(
            q_bytes,
            FusedCpu::weight_bytes_for(&config, Some(&held(2, base)))
        );
        let plain = Some(&LoraConfig::new(2));
        assert_eq!(f32_bytes, FusedCpu::weight_bytes_for(&config, plain));
        // Each held weight its share of its block's bytes (int8: a byte and an f16 scale every
        // 32; Q4_K: 144 bytes every 256; Q5_0: 22 every 32) instead of 4 bytes: no row kept
        // in f32 (the values are the blocks' own rounding).
        let saved: u64 = by_slot(&q)
            .iter()
            .filter(|(slot, shape, _)| held_matrix(*slot, shape, base))
            .map(|(_, shape, _)| {
                let kind = kind(base, shape[0]).unwrap();
                let weights = (shape[0] * shape[1]) as u64;
                4 * weights - weights / kind.values() as u64 * kind.block_bytes() as u64
            })
            .sum();
        assert!(saved > 0);
        assert_eq!(f32_bytes - q_bytes, saved, "{base:?} {config:?}");
    }
}

/// Burn's autodiff of the rounded model (its matrices in f32) against the engine multiplying
/// by the quantised copy dequantised, on one and two threads.
#[test]
fn adapter_gradients_on_a_quantised_base_match_burn_autodiff() {
    let _seeded = seeded();
    for (base, config) in BASES
        .iter()
        .flat_map(|&b| configs_for(b).into_iter().map(move |c| (b, c)))
    {
        let gpt = adapted(&config, &held(3, base));
        // Two factors on each of a block's four matrices.
        let factors = 2 * 4 * config.n_layer;
        assert_eq!(check(&gpt, 1), factors, "{config:?}");
        assert_eq!(check(&gpt, 2), factors, "{config:?}");
    }
}

#[test]
fn checkpointing_a_quantised_base_changes_nothing() {
    let _seeded = seeded();
    for (base, config) in BASES
        .iter()
        .flat_map(|&b| configs().into_iter().map(move |c| (b, c)))
    {
        let lora = LoraConfig {
            dropout: 0.2,
            ..held(2, base)
        };
        let gpt = adapted(&config.clone().with_dropout(0.1), &lora);
        let ids = batch(config.vocab_size);
        for threads in [1, 3] {
            let run = |checkpointing: bool| {
                let mut fused = FusedCpu::new(&gpt, threads).unwrap();
                fused.set_checkpointing(checkpointing);
                let loss = fused.accumulate(tokens(&ids), 1.0, Some(7)).unwrap();
                let grads = fused.take_gradients(&gpt);
                let layout = ParamLayout::of(&gpt);
                let trained = layout.entries().iter().filter(|e| layout.trains(e));
                let values: Vec<Vec<u32>> = trained
                    .map(|e| {
                        let g = grads.get::<2>(e.id).expect("a factor's gradient");
                        let g = g.into_data().try_to_vec::<f32>().unwrap();
                        g.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                (loss.to_bits(), values)
            };
            assert_eq!(run(true), run(false), "{config:?} on {threads} threads");
        }
    }
}

/// After a step the buffers hold what the memory estimate reads, the dequantised block
/// included.
#[test]
fn the_buffers_hold_what_the_estimate_reads_with_a_quantised_base() {
    let _seeded = seeded();
    for (base, config) in BASES
        .iter()
        .flat_map(|&b| configs_for(b).into_iter().map(move |c| (b, c)))
    {
        let gpt = adapted(&config, &held(2, base));
        let ids = batch(config.vocab_size);
        for (threads, checkpointing) in [(1, false), (2, true), (3, false)] {
            let mut fused = FusedCpu::new(&gpt, threads).unwrap();
            fused.set_checkpointing(checkpointing);
            fused.accumulate(tokens(&ids), 1.0, Some(3)).unwrap();
            let want = FusedCpu::workspace_bytes_for(
                &config,
                Some(&held(2, base)),
                (3, 12),
                threads,
                checkpointing,
            );
            assert_eq!(fused.workspace_bytes() as u64, want, "{config:?}");
        }
    }
}

/// Lent to Burn's model, the base goes as its rounded f32 values (the threads' buffers freed
/// first to make room); taken back it is the same int8 copy: the same bytes held, the same
/// loss, the same step.
#[test]
fn the_int8_base_is_lent_and_taken_back_unchanged() {
    lent_and_taken_back(configs().remove(1), BaseWeights::Q8_0);
}

#[test]
fn the_q4_k_base_is_lent_and_taken_back_unchanged() {
    lent_and_taken_back(configs_for(BaseWeights::Q4K).remove(3), BaseWeights::Q4K);
}

fn lent_and_taken_back(config: GptConfig, base: BaseWeights) {
    let _seeded = seeded();
    let gpt = adapted(&config, &held(2, base));
    let want = by_slot(&gpt);
    let ids = batch(config.vocab_size);
    let settings = AdamWSettings {
        beta_1: 0.9,
        beta_2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.0,
        decayed: Vec::new(),
        lr_ratios: LrRatios::default(),
    };
    let step = |fused: &mut FusedCpu| {
        let loss = fused.accumulate(tokens(&ids), 1.0, None).unwrap();
        fused.adamw_step(1e-3, &settings);
        loss.to_bits()
    };
    let (mut plain, _) = FusedCpu::taking(gpt.clone(), 2).unwrap();
    let (mut lending, hollow) = FusedCpu::taking(gpt.clone(), 2).unwrap();
    let held = lending.weight_bytes();
    assert_eq!(step(&mut lending), step(&mut plain));
    lending.release_buffers();
    // The engine goes with its weights: no step or loss compiles until it is reclaimed.
    let lent = lending.lend_weights(hollow);
    assert_eq!(lent.fused().workspace_bytes(), 0, "buffers freed");
    assert!(
        lent.fused().weight_bytes() < held,
        "the base is in the model, not here"
    );
    // The base as the model had it; the factors as the step left them.
    for ((slot, _, values), (_, _, given)) in want.iter().zip(by_slot(lent.model())) {
        if !matches!(slot, Slot::Adapter { .. }) {
            assert_eq!(values, &given, "{slot:?}");
        }
    }
    let (mut lending, hollow) = lent.reclaim();
    assert_eq!(lending.weight_bytes(), held);
    assert_eq!(step(&mut lending), step(&mut plain));
    // What a checkpoint writes, without lending: the factors the engine holds, and the base
    // as empty placeholders (nothing to make, nothing read).
    let lent = plain.lend_weights(gpt.clone());
    let trained = lending.trained_weights(&hollow);
    assert_eq!(lending.weight_bytes(), held, "nothing lent");
    let mut factors = 0;
    for ((slot, shape, values), (_, _, copied)) in
        by_slot(lent.model()).iter().zip(by_slot(&trained))
    {
        match slot {
            Slot::Adapter { .. } => {
                assert_eq!(values, &copied, "{slot:?}");
                factors += 1;
            }
            _ => assert!(
                copied.is_empty() && !shape.is_empty(),
                "{slot:?} is a placeholder"
            ),
        }
    }
    assert_eq!(factors, 2 * 4 * config.n_layer);
}

/// A snapshot's attention maps from the engine holding the base in its blocks are Burn's of
/// the rounded model with its adapters: nothing is lent for them.
#[test]
fn attention_maps_on_a_quantised_base_are_burns() {
    let _seeded = seeded();
    for base in BASES {
        let config = configs_for(base).remove(1);
        let gpt = adapted(&config, &held(2, base));
        let prompt: Vec<i64> = batch(config.vocab_size).0[..10].to_vec();
        let ids = Tensor::<2, Int>::from_data(
            TensorData::new(prompt.clone(), [1, prompt.len()]),
            &gpt.wte.weight.device(),
        );
        let (_, want) = gpt.forward_with_attention(ids).unwrap();
        let (mut fused, _hollow) = FusedCpu::taking(gpt, 2).unwrap();
        let got = fused.attention_maps(&prompt).unwrap();
        for (layer, (got, want)) in got.iter().zip(want).enumerate() {
            let want = want.into_data().try_to_vec::<f32>().unwrap();
            assert_eq!(got.iter().flatten().count(), want.len());
            for (g, w) in got.iter().flatten().zip(&want) {
                assert!(
                    (g - w).abs() < 1e-5,
                    "{base:?} layer {layer}: {g} vs Burn's {w}"
                );
            }
        }
    }
}

/// A base read from its file as it is first used (how the trainer loads a LoRA run's base):
/// attaching adapters and rounding the base to `Q4_K` read none of it, the engine reads each
/// matrix as it takes it (so the base is never whole in f32), and what it then computes is what
/// the same base read beforehand gives, bit for bit.
#[test]
fn a_base_read_as_it_is_used_is_read_by_the_engine_alone() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    struct Lazily(Arc<AtomicUsize>);
    impl ModuleMapper for Lazily {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let (id, device, shape) = (param.id, param.lazy_device(), param.lazy_shape());
            let (value, made) = (param.val(), self.0.clone());
            let read = move |_: &Device, require_grad: bool| {
                made.fetch_add(1, Ordering::SeqCst);
                value.set_require_grad(require_grad)
            };
            Param::uninitialized(id, read, device, true, shape)
        }
    }
    let _seeded = seeded();
    let device = Device::flex();
    let config = configs_for(BaseWeights::Q4K).remove(3);
    let read = common::init(&config, &device).copied_here();
    let made = Arc::new(AtomicUsize::new(0));
    let unread = read.clone().map(&mut Lazily(made.clone()));
    let lora = held(2, BaseWeights::Q4K);
    device.seed(7);
    let unread = unread.with_lora(&lora).unwrap();
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "nothing read to attach the adapters"
    );
    let (mut from_unread, _) = FusedCpu::taking(unread, 2).unwrap();
    let params = ParamLayout::of(&read).entries().len();
    assert_eq!(
        made.load(Ordering::SeqCst),
        params,
        "each read once, by the engine"
    );
    device.seed(7);
    let (mut from_read, _) = FusedCpu::taking(read.with_lora(&lora).unwrap(), 2).unwrap();
    assert_eq!(from_unread.weight_bytes(), from_read.weight_bytes());
    let ids = batch(config.vocab_size);
    let (a, b) = (
        from_unread.accumulate(tokens(&ids), 1.0, None).unwrap(),
        from_read.accumulate(tokens(&ids), 1.0, None).unwrap(),
    );
    assert_eq!(a.to_bits(), b.to_bits());
}

/// The largest difference between `got` and `want`, and `want`'s largest magnitude.
fn apart(got: &[f32], want: &[f32]) -> (f32, f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    (diff, scale)
}

/// A LoRA run's snapshot samples from the engine's own weights, nothing lent: a prompt, then
/// tokens one at a time, give Burn's logits of the model with its adapters (within 5% of the
/// largest where the base is multiplied from its blocks, its activations quantised: measured
/// 0.1% to 2.5%; 1e-4 in f32), far from the model's without them (40% to 390% apart), and the
/// engine steps afterwards exactly as one that did not sample.
#[test]
fn a_sample_decodes_from_the_weights_the_engine_holds() {
    let _seeded = seeded();
    for base in [BaseWeights::F32, BaseWeights::Q8_0, BaseWeights::Q4K] {
        for config in configs_for(base) {
            let gpt = adapted(&config, &held(2, base));
            let without = without_adapters(gpt.clone());
            let stream: Vec<u32> = batch(config.vocab_size).0[..14]
                .iter()
                .map(|&t| t as u32)
                .collect();
            let (mut plain, _) = FusedCpu::taking(gpt.clone(), 2).unwrap();
            let (mut sampling, _hollow) = FusedCpu::taking(gpt.clone(), 2).unwrap();
            let held_bytes = sampling.weight_bytes();
            let bound = match base {
                BaseWeights::F32 => 1e-4,
                BaseWeights::Q8_0 | BaseWeights::Q4K => 5e-2,
            };
            sampling.sample_with(2, |decoder| {
                let mut fed = 0;
                for step in [10, 1, 1, 1, 1] {
                    let got = decoder.feed(&stream[fed..fed + step]).unwrap();
                    fed += step;
                    let (diff, scale) = apart(&got, &burn_logits(&gpt, &stream[..fed]));
                    let (off, _) = apart(&got, &burn_logits(&without, &stream[..fed]));
                    eprintln!(
                        "{base:?} {} {fed}: {} vs without {}",
                        config.n_embd,
                        diff / scale,
                        off / scale
                    );
                    assert!(
                        diff <= bound * scale,
                        "{base:?} {config:?} after {fed}: {diff} apart, scale {scale}"
                    );
                }
            });
            assert_eq!(sampling.weight_bytes(), held_bytes, "{base:?}: all back");
            let ids = batch(config.vocab_size);
            let loss = |fused: &mut FusedCpu| {
                let loss = fused.accumulate(tokens(&ids), 1.0, None).unwrap();
                loss.to_bits()
            };
            assert_eq!(loss(&mut sampling), loss(&mut plain), "{base:?} {config:?}");
        }
    }
}
