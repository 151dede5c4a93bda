//! LoRA on a base rounded to `Q8_0` (`[lora] base = "q8_0"`): the model's block matrices are
//! their `Q8_0` rounding and nothing else changes; the fused CPU engine holds them in int8 (the
//! bytes it says), computes Burn's loss and adapter gradients from them, the same with
//! activation checkpointing bit for bit, sizes its buffers as the estimate says, and lends the
//! base out and takes it back unchanged.

mod common;

use burn::tensor::Device;
use common::lora::{adapted, batch, check};
use common::seeded;
use tinygpt_model::parts::{Mlp, Norm, Position};
use tinygpt_model::{
    AdamWSettings, BaseWeights, FusedCpu, Gpt, GptConfig, LoraConfig, LrRatios, ParamLayout,
    TokenBatch, decoding::q8_0_block, names::BlockSlot, names::Slot,
};

/// Adapters of `rank` on every matrix, the base in `Q8_0`.
fn int8(rank: usize) -> LoraConfig {
    LoraConfig {
        base: BaseWeights::Q8_0,
        ..LoraConfig::new(rank)
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

/// `w [n_in, n_out]` rounded to `Q8_0` along each output's inputs, from the public block
/// quantiser (what `export --dtype q8_0` writes).
fn rounded(w: &[f32], n_in: usize, n_out: usize) -> Vec<f32> {
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

/// Whether `slot` is one of a block's matrices whose inputs are whole blocks.
fn int8_matrix(slot: Slot, shape: &[usize]) -> bool {
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
    matrix && shape[0].is_multiple_of(32)
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
    for config in configs() {
        let base = common::init(&config, &Device::flex().autodiff());
        let want = by_slot(&base);
        let gpt = base.with_lora(&int8(2)).unwrap();
        assert_eq!(gpt.lora_base(), BaseWeights::Q8_0);
        let got = by_slot(&gpt);
        let mut rounded_matrices = 0;
        for (slot, shape, values) in &want {
            let (_, _, now) = got.iter().find(|(s, ..)| s == slot).expect("kept");
            if int8_matrix(*slot, shape) {
                assert_eq!(now, &rounded(values, shape[0], shape[1]), "{slot:?}");
                assert_ne!(now, values, "{slot:?} is rounded");
                rounded_matrices += 1;
            } else {
                assert_eq!(now, values, "{slot:?} is kept");
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
fn the_engine_holds_the_base_in_int8() {
    let _seeded = seeded();
    for config in configs() {
        let q8 = adapted(&config, &int8(2));
        let f32 = adapted(&config, &LoraConfig::new(2));
        let (q8_bytes, f32_bytes) = (
            FusedCpu::new(&q8, 1).unwrap().weight_bytes() as u64,
            FusedCpu::new(&f32, 1).unwrap().weight_bytes() as u64,
        );
        assert_eq!(
            q8_bytes,
            FusedCpu::weight_bytes_for(&config, Some(&int8(2)))
        );
        let plain = Some(&LoraConfig::new(2));
        assert_eq!(f32_bytes, FusedCpu::weight_bytes_for(&config, plain));
        // Each int8 weight a byte, and an f16 scale every 32, instead of 4 bytes.
        let saved: u64 = by_slot(&q8)
            .iter()
            .filter(|(slot, shape, _)| int8_matrix(*slot, shape))
            .map(|(_, shape, _)| (shape[0] * shape[1]) as u64 * (4 * 32 - 34) / 32)
            .sum();
        assert!(saved > 0);
        assert_eq!(f32_bytes - q8_bytes, saved, "{config:?}");
    }
}

/// Burn's autodiff of the rounded model (its matrices in f32) against the engine multiplying
/// by the int8 copy dequantised, on one and two threads.
#[test]
fn adapter_gradients_on_an_int8_base_match_burn_autodiff() {
    let _seeded = seeded();
    for config in configs() {
        let gpt = adapted(&config, &int8(3));
        // Two factors on each of a block's four matrices.
        let factors = 2 * 4 * config.n_layer;
        assert_eq!(check(&gpt, 1), factors, "{config:?}");
        assert_eq!(check(&gpt, 2), factors, "{config:?}");
    }
}

#[test]
fn checkpointing_an_int8_base_changes_nothing() {
    let _seeded = seeded();
    let lora = LoraConfig {
        dropout: 0.2,
        ..int8(2)
    };
    for config in configs() {
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
fn the_buffers_hold_what_the_estimate_reads_with_an_int8_base() {
    let _seeded = seeded();
    for config in configs() {
        let gpt = adapted(&config, &int8(2));
        let ids = batch(config.vocab_size);
        for (threads, checkpointing) in [(1, false), (2, true), (3, false)] {
            let mut fused = FusedCpu::new(&gpt, threads).unwrap();
            fused.set_checkpointing(checkpointing);
            fused.accumulate(tokens(&ids), 1.0, Some(3)).unwrap();
            let want = FusedCpu::workspace_bytes_for(
                &config,
                Some(&int8(2)),
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
    let _seeded = seeded();
    let config = configs().remove(1);
    let gpt = adapted(&config, &int8(2));
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
    let (mut lending, _hollow) = lent.reclaim();
    assert_eq!(lending.weight_bytes(), held);
    assert_eq!(step(&mut lending), step(&mut plain));
}
