//! The fused CPU engine's ways to hold less: activation checkpointing (each block's forward
//! recomputed in the backward) gives the gradients it gives without, bit for bit, for every
//! part, with dropout and on several threads.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor};
use common::{configs, seeded};
use tinygpt_model::{FusedCpu, Gpt, GptConfig, LoraConfig, TokenBatch};

/// Every gradient of `gpt`'s parameters in `grads`, in the model's order.
fn flat(gpt: &Gpt, grads: &GradientsParams) -> Vec<Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, Vec<Vec<f32>>);
    impl ModuleVisitor for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let g = self
                .0
                .get::<D>(param.id)
                .expect("a gradient for every parameter");
            self.1.push(g.into_data().try_to_vec::<f32>().unwrap());
        }
    }
    let mut collect = Collect(grads, Vec::new());
    gpt.visit(&mut collect);
    collect.1
}

/// Loss and gradients of two micro-batches (dropout from `seed` when the model has it).
/// Also the activations' bytes held after it, and the model's blocks.
fn step(
    gpt: &Gpt,
    checkpointing: bool,
    threads: usize,
    seed: u64,
) -> (f64, Vec<Vec<f32>>, usize, usize) {
    let (batch, seq) = (3, 12);
    let vocab = gpt.config().vocab_size;
    let ids: Vec<i64> = common::tokens(batch * seq + 1, vocab)
        .into_iter()
        .map(i64::from)
        .collect();
    let (inputs, targets) = (&ids[..batch * seq], &ids[1..]);
    let tokens = TokenBatch {
        inputs,
        targets,
        batch,
        seq,
    };
    let mut fused = FusedCpu::new(gpt, threads).unwrap();
    fused.set_checkpointing(checkpointing);
    let mut loss = fused.accumulate(tokens, 0.5, Some(seed)).unwrap();
    loss += fused.accumulate(tokens, 0.5, Some(seed + 1)).unwrap();
    // Evaluation (no gradients) through the same held block.
    loss += fused.loss(tokens).unwrap();
    let blocks = gpt.config().n_layer;
    let held = fused.activation_bytes();
    (loss, flat(gpt, &fused.take_gradients(gpt)), held, blocks)
}

fn assert_checkpointing_changes_nothing(config: &GptConfig, threads: usize) {
    let gpt = common::init(config, &Device::flex().autodiff());
    let (want_loss, want, all, blocks) = step(&gpt, false, threads, 5);
    let (loss, got, held, _) = step(&gpt, true, threads, 5);
    // One block's activations instead of every block's.
    assert!(
        blocks < 2 || held < all,
        "{held} bytes held with checkpointing, {all} without"
    );
    assert_eq!(loss.to_bits(), want_loss.to_bits(), "{config:?}");
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "parameter {i} of {config:?} on {threads} threads");
    }
}

#[test]
fn checkpointing_gives_the_same_gradients_for_every_part() {
    let _seeded = seeded();
    for config in configs() {
        assert_checkpointing_changes_nothing(&config, 1);
    }
}

#[test]
fn checkpointing_redraws_the_same_dropout_masks_on_every_thread_count() {
    let _seeded = seeded();
    for config in [
        common::small().with_dropout(0.3),
        common::modern_parts().with_dropout(0.2).with_n_layer(3),
        common::small()
            .with_mlp(tinygpt_model::parts::Mlp::None)
            .with_dropout(0.1),
    ] {
        for threads in [1, 2, 3] {
            assert_checkpointing_changes_nothing(&config, threads);
        }
    }
}

/// The trainer's memory estimate takes the engine's activations and scratch from
/// `FusedCpu::workspace_bytes_for`: after a step the buffers hold what it says, for every part,
/// with and without checkpointing, dropout and adapters, on one to three threads.
#[test]
fn the_buffers_hold_what_the_estimate_reads() {
    let _seeded = seeded();
    let (batch, seq) = (3, 12);
    let lora = LoraConfig::new(2);
    let dropping = LoraConfig {
        dropout: 0.1,
        ..LoraConfig::new(2)
    };
    let dropout = common::small().with_dropout(0.3);
    for config in configs().into_iter().chain([dropout]) {
        let ids: Vec<i64> = common::tokens(batch * seq + 1, config.vocab_size)
            .into_iter()
            .map(i64::from)
            .collect();
        let tokens = TokenBatch {
            inputs: &ids[..batch * seq],
            targets: &ids[1..],
            batch,
            seq,
        };
        for adapters in [None, Some(&lora), Some(&dropping)] {
            let mut gpt = common::init(&config, &Device::flex().autodiff());
            if let Some(lora) = adapters {
                gpt = gpt.with_lora(lora).unwrap();
            }
            for (threads, checkpointing) in [(1, false), (2, true), (3, false), (3, true)] {
                let mut fused = FusedCpu::new(&gpt, threads).unwrap();
                fused.set_checkpointing(checkpointing);
                fused.accumulate(tokens, 1.0, Some(3)).unwrap();
                let shape = (batch, seq);
                let want =
                    FusedCpu::workspace_bytes_for(&config, adapters, shape, threads, checkpointing);
                assert_eq!(
                    fused.workspace_bytes() as u64,
                    want,
                    "{config:?}, {adapters:?}, {threads} threads, checkpointing {checkpointing}"
                );
            }
        }
    }
}
