//! The fused step's gradients summed over ranks while its backward goes on
//! (`FusedCpu::accumulate_summed`) against the step followed by the same sum on every gradient:
//! the same values bit for bit, for every config, one to three threads, dropout, checkpointing,
//! a second micro-batch and LoRA (on an f32 and an int8 base); each block's sum taken as one
//! buffer on a thread of its own, the last block first, the embeddings and the head after.

mod common;

use std::sync::Mutex;
use std::thread::ThreadId;

use common::lora::adapted;
use common::{configs, seeded};
use tinygpt_model::names::Slot;
use tinygpt_model::{
    BaseWeights, FusedCpu, Gpt, GptConfig, GradientSum, LoraConfig, ParamLayout, TokenBatch,
};

/// A stand-in for the ranks' all-reduce: every value mapped as another rank's would be added
/// (`2v + 0.5`), and each call's length and thread recorded.
struct Recorded(Mutex<Vec<(usize, ThreadId)>>);

impl GradientSum for Recorded {
    fn sum(&self, values: &mut [f32]) {
        values.iter_mut().for_each(|v| *v = 2.0 * *v + 0.5);
        let mut calls = self.0.lock().unwrap();
        calls.push((values.len(), std::thread::current().id()));
    }
}

fn batch_of(vocab: usize, rows: usize, seq: usize, salt: u64) -> (Vec<i64>, Vec<i64>) {
    let ids: Vec<i64> = (0..(rows * seq + 1) as u64)
        .map(|i| ((i * 2654435761 + salt * 97) >> 7) as i64 % vocab as i64)
        .collect();
    (ids[..rows * seq].to_vec(), ids[1..].to_vec())
}

fn token_batch((inputs, targets): &(Vec<i64>, Vec<i64>)) -> TokenBatch<'_> {
    TokenBatch {
        inputs,
        targets,
        batch: 3,
        seq: 12,
    }
}

/// Every held gradient, in the layout's order.
fn gradients(fused: &mut FusedCpu) -> Vec<Vec<f32>> {
    let mut all = Vec::new();
    fused.for_each_gradient(|g| all.push(g.to_vec()));
    all
}

fn block_of(slot: Slot) -> Option<usize> {
    match slot {
        Slot::Block(l, _) | Slot::Adapter { layer: l, .. } => Some(l),
        _ => None,
    }
}

/// The lengths the sum is called with: each block's trained gradients as one buffer, the last
/// block first, then the rest a tensor at a time, in the layout's order.
fn expected_calls(gpt: &Gpt) -> (Vec<usize>, usize) {
    let layout = ParamLayout::of(gpt);
    let trained: Vec<_> = layout
        .entries()
        .iter()
        .filter(|e| layout.trains(e))
        .collect();
    let len = |e: &&tinygpt_model::LayoutEntry| e.shape.iter().product::<usize>();
    let layers = trained
        .iter()
        .filter_map(|e| block_of(e.slot))
        .max()
        .map_or(0, |l| l + 1);
    let mut calls = Vec::new();
    for l in (0..layers).rev() {
        let block = trained.iter().filter(|e| block_of(e.slot) == Some(l));
        calls.push(block.map(len).sum());
    }
    let in_blocks = calls.len();
    calls.extend(
        trained
            .iter()
            .filter(|e| block_of(e.slot).is_none())
            .map(len),
    );
    (calls, in_blocks)
}

/// One step of `micro` micro-batches on `threads` threads, the last summed over the stand-in
/// ranks as the engine overlaps it, against the same step summed after it; both bit for bit.
fn check(gpt: &Gpt, threads: usize, micro: usize, dropout: Option<u64>, checkpointing: bool) {
    let vocab = gpt.wte.weight.dims()[0];
    let batches: Vec<_> = (0..micro as u64)
        .map(|k| batch_of(vocab, 3, 12, k))
        .collect();
    let run = |overlapped: bool| {
        let mut fused = FusedCpu::new(gpt, threads).unwrap();
        fused.set_checkpointing(checkpointing);
        let ranks = Recorded(Mutex::new(Vec::new()));
        let mut loss = 0.0;
        for (k, batch) in batches.iter().enumerate() {
            let seed = dropout.map(|s| s + k as u64);
            let scale = 1.0 / micro as f32;
            loss += match overlapped && k + 1 == micro {
                true => fused.accumulate_summed(token_batch(batch), scale, seed, &ranks),
                false => fused.accumulate(token_batch(batch), scale, seed),
            }
            .unwrap();
        }
        if !overlapped {
            fused.for_each_gradient(|g| ranks.sum(g));
        }
        (loss, gradients(&mut fused), ranks.0.into_inner().unwrap())
    };
    let context = format!("{threads} threads, {micro} micro-batches, dropout {dropout:?}");
    let (loss, after, _) = run(false);
    let (loss_overlapped, overlapped, calls) = run(true);
    assert_eq!(loss.to_bits(), loss_overlapped.to_bits(), "loss, {context}");
    assert_eq!(after.len(), overlapped.len(), "{context}");
    for (i, (a, b)) in after.iter().zip(&overlapped).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "gradient {i} differs, {context}");
    }
    let (lengths, in_blocks) = expected_calls(gpt);
    let called: Vec<usize> = calls.iter().map(|&(len, _)| len).collect();
    assert_eq!(called, lengths, "the order of the sums, {context}");
    let here = std::thread::current().id();
    let on_own_thread = calls[..in_blocks].iter().all(|&(_, id)| id != here);
    assert!(
        on_own_thread,
        "blocks are summed on a thread of their own, {context}"
    );
}

#[test]
fn overlapped_sums_are_the_sums_after_the_step_for_every_config() {
    let _seeded = seeded();
    for config in configs() {
        let gpt = common::init(&config.clone().with_dropout(0.2), &burn_device());
        for threads in [1, 2, 3] {
            check(&gpt, threads, 1, Some(7), false);
        }
        check(&gpt, 2, 2, Some(7), false);
        check(&gpt, 2, 2, None, true);
    }
}

#[test]
fn overlapped_sums_of_lora_runs_reduce_only_the_trained_tensors() {
    let _seeded = seeded();
    let config: GptConfig = common::modern_parts();
    for base in [BaseWeights::F32, BaseWeights::Q8_0, BaseWeights::Q4K] {
        let lora = LoraConfig {
            rank: 2,
            alpha: Some(4.0),
            dropout: 0.1,
            targets: None,
            base,
            also_train: Vec::new(),
        };
        let gpt = adapted(&config.clone().with_n_embd(64).with_n_head(2), &lora);
        check(&gpt, 2, 2, Some(3), false);
        check(&gpt, 1, 1, Some(3), true);
    }
}

fn burn_device() -> burn::tensor::Device {
    burn::tensor::Device::flex().autodiff()
}
