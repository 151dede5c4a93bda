//! What adding up a run's gradients over the ranks costs (`mpirun -np N tinygpt bench
//! --all-reduce`): the trained tensors of each config, all-reduced as a step over ranks adds
//! them, one tensor at a time, and once more as one buffer, timed on the network the job runs
//! on. The figures feed the model of a step on N machines in docs/distributed.md.

use std::time::Instant;

use anyhow::Result;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use serde::Serialize;

use super::Ranks;
use crate::config::RunConfig;
use burn::tensor::Device;

/// One config's all-reduce, measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReduceCost {
    pub config: String,
    pub ranks: usize,
    /// The trained parameters' count (a LoRA run's: the adapters', and what trains beside).
    pub trained_params: usize,
    /// Their gradients' bytes, in f32.
    pub bytes: usize,
    /// How many tensors a step all-reduces.
    pub tensors: usize,
    /// Median seconds to all-reduce them one tensor at a time, as the trainer does.
    pub per_tensor_s: f64,
    /// Median seconds to copy them into one buffer, all-reduce it and copy them back.
    pub one_buffer_s: f64,
    /// Median seconds to all-reduce them as one buffer through the fused engine's overlapped
    /// sum (MPI's non-blocking all-reduce, tested between sleeps on a thread of its own, as the
    /// engine sums a block at a time while its backward goes on; here on an idle machine);
    /// `None` where MPI allows no calls from other threads.
    pub overlapped_s: Option<f64>,
    /// Bus bandwidth of the faster form, bytes/s: `bytes · 2(N−1)/N / seconds`, the figure
    /// that a ring all-reduce's link carries (nccl-tests' convention), comparable across N.
    pub bus_bytes_per_s: f64,
}

/// The median seconds of one all-reduce of 4 bytes over `ranks`: the network's latency as
/// the collective sees it.
pub fn latency(ranks: &Ranks, rounds: usize) -> f64 {
    let mut value = [0.0f32];
    median(rounds, || {
        let start = Instant::now();
        ranks.sum_f32(&mut value);
        start.elapsed().as_secs_f64()
    })
}

/// Times the all-reduce of `config`'s trained gradients over `ranks`: `warmup` rounds, then
/// the median of `rounds`.
pub fn reduce_cost(
    ranks: &Ranks,
    name: &str,
    config: &RunConfig,
    vocab: usize,
    warmup: usize,
    rounds: usize,
) -> Result<ReduceCost> {
    let sizes = trained_sizes(config, vocab)?;
    // Zeros: their sums stay zeros however many rounds (no overflow to infinities).
    let mut tensors: Vec<Vec<f32>> = sizes.iter().map(|&n| vec![0.0; n]).collect();
    let total: usize = sizes.iter().sum();
    let mut flat = vec![0.0f32; total];
    let per_tensor = || {
        for t in tensors.iter_mut() {
            ranks.sum_f32(t);
        }
    };
    let per_tensor_s = timed(ranks, warmup, rounds, per_tensor);
    let one_buffer = || {
        let mut at = 0;
        for t in &tensors {
            flat[at..at + t.len()].copy_from_slice(t);
            at += t.len();
        }
        ranks.sum_f32(&mut flat);
        let mut at = 0;
        for t in tensors.iter_mut() {
            let n = t.len();
            t.copy_from_slice(&flat[at..at + n]);
            at += n;
        }
    };
    let one_buffer_s = timed(ranks, warmup, rounds, one_buffer);
    let overlapped_s = ranks.overlapped_sum().map(|sum| {
        let from_a_thread = || {
            std::thread::scope(|scope| {
                scope.spawn(|| sum.sum(&mut flat));
            })
        };
        timed(ranks, warmup, rounds, from_a_thread)
    });
    let n = ranks.size() as f64;
    let bytes = total * std::mem::size_of::<f32>();
    let best = per_tensor_s.min(one_buffer_s);
    Ok(ReduceCost {
        config: name.to_string(),
        ranks: ranks.size(),
        trained_params: total,
        bytes,
        tensors: sizes.len(),
        per_tensor_s,
        one_buffer_s,
        overlapped_s,
        bus_bytes_per_s: bytes as f64 * 2.0 * (n - 1.0) / n / best,
    })
}

/// The median seconds of `rounds` calls of `f` after `warmup`, every rank starting each
/// together (a 4-byte all-reduce before it), as rank 0 times them.
fn timed(ranks: &Ranks, warmup: usize, rounds: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    median(rounds, || {
        ranks.sum_f32(&mut [0.0]);
        let start = Instant::now();
        f();
        start.elapsed().as_secs_f64()
    })
}

fn median(rounds: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut times: Vec<f64> = (0..rounds.max(1)).map(|_| f()).collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The element counts of the tensors a step over ranks adds up for `config` (its model for a
/// vocabulary of `vocab`, with its `[lora]` adapters when it has them), in the model's order.
fn trained_sizes(config: &RunConfig, vocab: usize) -> Result<Vec<usize>> {
    struct Trained(Vec<usize>);
    impl ModuleVisitor for Trained {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if param.is_require_grad() {
                self.0.push(param.shape().num_elements());
            }
        }
    }
    // Under autodiff: what trains is what asks for a gradient.
    let model = crate::bench::model_of(config, vocab, &Device::flex().autodiff())?;
    let mut trained = Trained(Vec::new());
    model.visit(&mut trained);
    Ok(trained.0)
}
