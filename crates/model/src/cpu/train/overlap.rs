//! Adding the gradients up over a data-parallel run's ranks while the backward goes on (llm.c's
//! overlap): a block's gradient is final once every thread's backward has passed it, so it is
//! summed over the threads, in their order, and handed to the ranks' all-reduce on a thread of
//! its own while the threads go on to the blocks below. The embeddings' and the head's
//! gradients are final only at the end (a tied embedding gets the head's and the inputs'), and
//! are added after.
//!
//! ```text
//! thread 0  ... block 2 bwd | block 1 bwd | block 0 bwd | embeddings
//! thread 1  ... block 2 bwd    | block 1 bwd    | block 0 bwd | embeddings
//! reducer        wait 2 ....... sum 2 ranks |wait 1| sum 1 ... | sum 0 |  then the rest
//! ```
//!
//! The sums are the ones [`FusedCpu::accumulate`](super::FusedCpu::accumulate) makes, bit for
//! bit: each block's held gradient plus thread 0's, then thread 1's, …; over zero gradients
//! thread 0's own buffer becomes the sum, as there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::cpu::params::{BlockParams, InBlock, Params, in_block};
use crate::optim::ParamLayout;

/// Adds a gradient up over the ranks of a data-parallel run, in place: every rank calls it with
/// its own values, in the same order, and each gets the sums (MPI's all-reduce). The engine calls
/// it from a thread of its own while its other threads compute.
pub trait GradientSum: Sync {
    fn sum(&self, values: &mut [f32]);
}

/// One block's sum over the threads: `next` is the thread whose share is added next; the sum is
/// `None` until thread 0 hands in its buffer when the step's gradients start from zero.
struct Turn {
    next: usize,
    sum: Option<BlockParams>,
}

/// The blocks' sums of one step, filled by the threads in their order and reduced over the
/// ranks as each is complete.
pub(crate) struct LayerSums {
    turns: Vec<(Mutex<Turn>, Condvar)>,
    threads: usize,
    /// The trained buffers of each block, in the layout's order.
    parts: Vec<Vec<InBlock>>,
    /// Set when a thread panicked: no one waits for its turn any more.
    failed: AtomicBool,
}

impl LayerSums {
    /// Sums over `threads` threads of the `layers` blocks of a model laid out as `layout`,
    /// starting from the held `blocks` (empty: from zero, thread 0's buffers becoming the sums).
    pub(crate) fn new(
        layout: &ParamLayout,
        blocks: Vec<BlockParams>,
        layers: usize,
        threads: usize,
    ) -> Self {
        let mut parts = vec![Vec::new(); layers];
        for entry in layout.entries() {
            if let Some((l, at)) = in_block(entry.slot) {
                parts[l].push(at);
            }
        }
        let mut sums: Vec<Option<BlockParams>> = blocks.into_iter().map(Some).collect();
        sums.resize_with(layers, || None);
        let turns = sums
            .into_iter()
            .map(|sum| (Mutex::new(Turn { next: 0, sum }), Condvar::new()))
            .collect();
        Self {
            turns,
            threads,
            parts,
            failed: AtomicBool::new(false),
        }
    }

    /// Waits until block `l`'s turn is `ready`'s (or a thread has failed: `None`).
    fn wait(&self, l: usize, ready: impl Fn(&Turn) -> bool) -> Option<MutexGuard<'_, Turn>> {
        let (lock, changed) = &self.turns[l];
        let mut turn = lock.lock().unwrap_or_else(|e| e.into_inner());
        while !ready(&turn) {
            if self.failed.load(Ordering::Acquire) {
                return None;
            }
            turn = changed.wait(turn).unwrap_or_else(|e| e.into_inner());
        }
        Some(turn)
    }

    /// Adds thread `t`'s gradient of block `l` to the sum, after thread `t - 1`'s. Thread 0's
    /// buffers become the sum when it starts from zero (they are then taken from `part`).
    pub(crate) fn add(&self, t: usize, l: usize, part: &mut BlockParams) {
        let Some(mut turn) = self.wait(l, |turn| turn.next == t) else {
            return;
        };
        match &mut turn.sum {
            None => turn.sum = Some(std::mem::take(part)),
            Some(sum) => {
                for &at in &self.parts[l] {
                    if let (Some(sum), Some(add)) =
                        (sum.part_mut(at).get_mut(), part.part(at).get())
                    {
                        sum.iter_mut().zip(add).for_each(|(a, b)| *a += b);
                    }
                }
            }
        }
        turn.next += 1;
        self.turns[l].1.notify_all();
    }

    /// Sums every block's gradient over the ranks, the last block first, each as soon as every
    /// thread has added its share: its trained buffers copied into one, so that a block is one
    /// all-reduce (few and large, as PyTorch's DDP buckets them: a norm's gain alone would
    /// pay the network's latency for a few hundred values).
    pub(crate) fn reduce(&self, ranks: &dyn GradientSum) {
        let mut flat = Vec::new();
        for l in (0..self.turns.len()).rev() {
            let Some(mut turn) = self.wait(l, |turn| turn.next == self.threads) else {
                return;
            };
            let sum = turn.sum.as_mut().expect("every thread has added its share");
            flat.clear();
            for &at in &self.parts[l] {
                flat.extend_from_slice(sum.part(at).get().unwrap_or_default());
            }
            if flat.is_empty() {
                continue;
            }
            ranks.sum(&mut flat);
            let mut rest = &flat[..];
            for &at in &self.parts[l] {
                if let Some(values) = sum.part_mut(at).get_mut() {
                    let (mine, after) = rest.split_at(values.len());
                    values.copy_from_slice(mine);
                    rest = after;
                }
            }
        }
    }

    /// Wakes every waiter for good: a thread panicked and will not take its turns.
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        for (lock, changed) in &self.turns {
            drop(lock.lock().unwrap_or_else(|e| e.into_inner()));
            changed.notify_all();
        }
    }

    /// The summed blocks, back into `held`.
    pub(crate) fn finish(self, held: &mut Params) {
        held.blocks = self
            .turns
            .into_iter()
            .map(|(turn, _)| {
                let turn = turn.into_inner().unwrap_or_else(|e| e.into_inner());
                turn.sum.expect("every block summed")
            })
            .collect();
    }
}

/// What a thread's backward tells the sums: which thread it is.
#[derive(Clone, Copy)]
pub(crate) struct BlockDone<'a> {
    pub sums: &'a LayerSums,
    pub thread: usize,
}

impl BlockDone<'_> {
    /// Thread `self.thread` has the final gradient of block `l` in `part`.
    pub(crate) fn done(self, l: usize, part: &mut BlockParams) {
        self.sums.add(self.thread, l, part);
    }
}

/// Held by each thread of a step while it computes: if it unwinds (a panic), the others stop
/// waiting for its turns rather than hang.
pub(crate) struct FailOnPanic<'a>(pub &'a LayerSums);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail();
        }
    }
}
