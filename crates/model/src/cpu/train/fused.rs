//! [`FusedCpu`]: the training step's facade, what the trainer holds: the weights, gradients
//! and optimizer state as flat buffers, the threads' workspaces, and AdamW. Muon's methods are
//! in `fused_muon.rs`.

use std::sync::Arc;

use burn::optim::GradientsParams;

use super::adamw::Moments;
use super::muon::Velocities;
use super::overlap::{BlockDone, FailOnPanic, GradientSum, LayerSums};
use super::shared_moments::{MomentEntry, SharedMoments};
use super::workspace::{Job, Sizing, TokenBatch, Workspace, floats_for};
use crate::arch::{BaseWeights, GptConfig, LoraConfig, LoraTarget};
use crate::cpu::buffer::Buffer;
use crate::cpu::dims::Dims;
use crate::cpu::error::FusedError;
use crate::cpu::params::{Params, in_block};
use crate::error::ModelError;
use crate::nn::{Gpt, IGNORE_INDEX, kept_targets};
use crate::optim::{AdamWSettings, MomentState, ParamLayout, clip_factor};

/// Computes loss and gradients of a [`Gpt`] on the CPU with fused, hand-written kernels, on
/// `threads` threads. Create it once and reuse it: its buffers are kept between calls.
///
/// ```text
/// let mut fused = FusedCpu::new(&model, 2)?;
/// fused.read_weights(&model);                 // after every optimizer step
/// let loss = fused.accumulate(batch, 1.0, Some(seed))?;
/// let grads = fused.take_gradients(&model);   // Burn GradientsParams for the optimizer
/// ```
///
/// or, keeping the weights and AdamW's moments here between steps (no copies to and from Burn):
///
/// ```text
/// fused.accumulate(batch, 1.0, Some(seed))?;
/// fused.adamw_step(lr, &settings);
/// let model = fused.write_weights(model);     // when Burn needs them: checkpoints, sampling
/// let state = fused.adamw_state();            // the optimizer's state, as Burn's AdamW keeps it
/// ```
#[derive(Debug)]
pub struct FusedCpu {
    pub(crate) dims: Dims,
    /// The weights, laid out by the model's [`ParamLayout`]; the gradients and moments follow
    /// the same layout.
    pub(crate) weights: Params,
    pub(crate) grads: Params,
    /// Whether `grads` are all zero (none accumulated since the last reset): the first thread
    /// then computes its share into them, not into a buffer of its own added after.
    pub(crate) grads_zero: bool,
    /// AdamW's moments, from the first [`FusedCpu::adamw_step`] or a loaded state; shared
    /// with a serialiser while it writes them ([`FusedCpu::share_adamw_state`]).
    pub(crate) moments: Option<Arc<Moments>>,
    /// Muon's momentum for the matrices it updates, from [`FusedCpu::use_muon`].
    pub(crate) muon: Option<Velocities>,
    pub(crate) work: Vec<Workspace>,
}

impl FusedCpu {
    /// Reads `gpt`'s sizes and weights. `threads` (≥ 1) is how many groups a batch is split into;
    /// results are reproducible for a given value.
    pub fn new(gpt: &Gpt, threads: usize) -> Result<Self, FusedError> {
        let dims = Dims::of(gpt)?;
        let weights = Params::read(gpt, Arc::new(ParamLayout::of(gpt)));
        Ok(Self::holding(dims, weights, threads))
    }

    /// An engine of `dims` holding `weights`, no gradients or optimizer state yet.
    fn holding(dims: Dims, weights: Params, threads: usize) -> Self {
        let mut grads = Params::default();
        grads.zero_like(&weights);
        let work = (0..threads.max(1)).map(|_| Workspace::default()).collect();
        Self {
            dims,
            weights,
            grads,
            grads_zero: true,
            moments: None,
            muon: None,
            work,
        }
    }

    /// Activation checkpointing: keep one block's activations instead of every block's, and
    /// recompute each block's forward in the backward from its input. The same gradients, bit
    /// for bit, in about a third more time; the activations held fall by about the number of
    /// blocks (the residual stream between blocks, the logits and one block's are kept).
    pub fn set_checkpointing(&mut self, on: bool) {
        self.work.iter_mut().for_each(|w| w.checkpointing = on);
    }

    /// Bytes of the weights held here: their f32 buffers, and a frozen base held in int8
    /// (`[lora] base = "q8_0"`).
    pub fn weight_bytes(&self) -> usize {
        let w = &self.weights;
        let f32s: usize = w
            .layout()
            .entries()
            .iter()
            .map(|e| w.slot(e.slot).len())
            .sum();
        4 * f32s + w.base_held_bytes()
    }

    /// What [`weight_bytes`](Self::weight_bytes) is for a model of `config` with `lora`'s
    /// adapters, from the sizes alone (the trainer's memory estimate).
    pub fn weight_bytes_for(config: &GptConfig, lora: Option<&LoraConfig>) -> u64 {
        let adapters = lora.map_or(0, |lora| lora.num_params(config));
        let f32s = 4 * (config.num_params() + adapters);
        // Each weight held quantised: its share of its blocks' bytes instead of four.
        let (weights, bytes) = held_weights(config, lora);
        f32s - ((4 * weights - bytes) * config.n_layer) as u64
    }

    /// Bytes of activations the threads hold after the last step (what checkpointing cuts).
    pub fn activation_bytes(&self) -> usize {
        4 * self
            .work
            .iter()
            .map(|w| w.activation_floats())
            .sum::<usize>()
    }

    /// Bytes of every thread's buffers after the last step: the activations and the backward's
    /// scratch (not the gradients' buffers), what [`workspace_bytes_for`](Self::workspace_bytes_for)
    /// predicts.
    pub fn workspace_bytes(&self) -> usize {
        4 * self.work.iter().map(Workspace::floats).sum::<usize>()
    }

    /// What [`workspace_bytes`](Self::workspace_bytes) is after a training step of `batch`
    /// sequences of `seq` tokens on `threads` threads, for a model of `config` with `lora`'s
    /// adapters, with or without activation checkpointing: computed from the sizes alone,
    /// nothing allocated (the trainer's memory estimate).
    pub fn workspace_bytes_for(
        config: &GptConfig,
        lora: Option<&LoraConfig>,
        (batch, seq): (usize, usize),
        threads: usize,
        checkpointing: bool,
    ) -> u64 {
        let d = Dims::from_config(config);
        let mut lora_ranks = [0; 4];
        if let Some(lora) = lora {
            for target in lora.targets(config) {
                if target.shape(config).is_some() {
                    lora_ranks[target as usize] = lora.rank;
                }
            }
        }
        let base_rows = held_weights(config, lora).0;
        let groups = threads.max(1).min(batch);
        let floats: usize = (0..groups)
            .map(|g| {
                let sizing = Sizing {
                    layers: config.n_layer,
                    seqs: batch / groups + usize::from(g < batch % groups),
                    seq,
                    checkpointing,
                    grad: true,
                    dropout: d.dropout > 0.0,
                    lora_ranks,
                    lora_dropout: lora.is_some_and(|lora| lora.dropout > 0.0),
                    base_rows,
                };
                floats_for(&d, sizing)
            })
            .sum();
        4 * floats as u64
    }

    /// [`FusedCpu::new`], the weights moved out of `gpt` rather than copied (on the CPU they
    /// then exist once, here), and `gpt` returned hollow: every parameter a lazy one of the same
    /// id and shape, to be written in again by [`lend_weights`](Self::lend_weights).
    pub fn taking(gpt: Gpt, threads: usize) -> Result<(Self, Gpt), FusedError> {
        let dims = Dims::of(&gpt)?;
        let (weights, hollow) = Params::take(gpt);
        Ok((Self::holding(dims, weights, threads), hollow))
    }

    /// Re-reads the weights of `gpt` (same architecture), e.g. after an optimizer step.
    pub fn read_weights(&mut self, gpt: &Gpt) {
        self.weights = Params::read(gpt, self.weights.shared_layout());
    }

    /// `gpt` (the model this was created from, or one with the same parameter ids) with the
    /// weights held here.
    pub fn write_weights(&self, gpt: Gpt) -> Gpt {
        self.weights.write(gpt)
    }

    /// Frees the threads' buffers (activations and scratch) between steps; the next step
    /// sizes them again. What makes room for a base held in int8 while it is lent out in f32
    /// ([`lend_weights`](Self::lend_weights)).
    pub fn release_buffers(&mut self) {
        self.work.iter_mut().for_each(Workspace::release);
    }

    /// How the frozen base is held here (`[lora] base`; `f32` without adapters).
    pub fn base(&self) -> BaseWeights {
        self.weights.base
    }

    /// One AdamW step on the held weights along the held gradients (Burn's `AdamW` arithmetic,
    /// bit for bit), then the gradients are reset to zero.
    pub fn adamw_step(&mut self, lr: f64, settings: &AdamWSettings) {
        self.allocate_gradients();
        let moments = moments_mut(&mut self.moments, &self.weights);
        moments.step(&mut self.weights, &self.grads, settings, lr);
        self.reset_gradients();
    }

    /// AdamW's state of every parameter it updates (all but Muon's matrices and a frozen base;
    /// empty before the first step), in the layout's order.
    pub fn adamw_state(&self) -> Vec<MomentState> {
        let Some(shared) = self.share_adamw_state() else {
            return Vec::new();
        };
        let state = |(i, entry): (usize, &MomentEntry)| MomentState {
            id: entry.id,
            shape: entry.shape.clone(),
            time: entry.time,
            moment_1: shared.moment_1(i).to_vec(),
            moment_2: shared.moment_2(i).to_vec(),
        };
        shared.entries().iter().enumerate().map(state).collect()
    }

    /// AdamW's state (as [`adamw_state`](Self::adamw_state) lists it), shared rather than
    /// copied; `None` before the first step. Drop it before the next step, which would
    /// otherwise copy the moments to update them.
    pub fn share_adamw_state(&self) -> Option<SharedMoments> {
        let moments = self.moments.as_ref()?;
        let muon = |i: usize| self.muon.as_ref().is_some_and(|m| m.updates(i));
        let layout = self.weights.layout();
        let entries = layout
            .entries()
            .iter()
            .zip(&moments.time)
            .enumerate()
            .filter(|(i, (entry, _))| !muon(*i) && layout.trains(entry))
            .map(|(_, (entry, &time))| MomentEntry {
                id: entry.id,
                shape: entry.shape.clone(),
                time,
                slot: entry.slot,
            })
            .collect::<Vec<_>>();
        Some(SharedMoments::new(Arc::clone(moments), entries))
    }

    /// Continues from a saved AdamW state (e.g. Burn's, on resume): one entry per parameter
    /// AdamW updates (all but Muon's matrices, after [`use_muon`](Self::use_muon)), or none. A
    /// state that does not fit is refused, and what was held stays.
    pub fn load_adamw_state(&mut self, states: Vec<MomentState>) -> Result<(), FusedError> {
        let layout = self.weights.layout();
        let muon = |i: usize| self.muon.as_ref().is_some_and(|m| m.updates(i));
        let trains = |i: usize| layout.trains(&layout.entries()[i]);
        let ordered = layout
            .gather_where(states, |i| !muon(i) && trains(i))
            .map_err(|e| FusedError::OptimizerState(e.to_string()))?;
        if ordered.is_empty() {
            self.moments = None;
            return Ok(());
        }
        // Muon's matrices keep zero moments, never stepped.
        let mut moments = Moments::zeros(&self.weights);
        for ((entry, state), time) in layout.entries().iter().zip(ordered).zip(&mut moments.time) {
            if let Some(state) = state {
                *moments.m.slot_mut(entry.slot) = Buffer::Held(state.moment_1);
                *moments.v.slot_mut(entry.slot) = Buffer::Held(state.moment_2);
                *time = state.time;
            }
        }
        self.moments = Some(Arc::new(moments));
        Ok(())
    }

    /// The mean loss over the kept targets of `batch`, without gradients or dropout (evaluation).
    pub fn loss(&mut self, batch: TokenBatch<'_>) -> Result<f64, FusedError> {
        self.run(batch, None, None)
    }

    /// Adds `scale ×` the gradients of `batch`'s mean loss to those held (e.g. `scale` =
    /// 1/grad_accum) and returns the mean loss. `dropout_seed`: `None` turns dropout off; with a
    /// seed, each sequence's masks depend only on the seed and its index in the batch.
    pub fn accumulate(
        &mut self,
        batch: TokenBatch<'_>,
        scale: f32,
        dropout_seed: Option<u64>,
    ) -> Result<f64, FusedError> {
        self.run(batch, Some(scale), dropout_seed)
    }

    /// [`accumulate`](Self::accumulate), then every held gradient summed over the ranks of a
    /// data-parallel run by `ranks` (call it on a rank's last micro-batch of a step): each
    /// block's as soon as every thread's backward has passed it, on a thread of its own while
    /// the backward goes on (llm.c's overlap), the embeddings' and the head's at the end. The
    /// sums are those of `accumulate` followed by `ranks` on every gradient, bit for bit.
    pub fn accumulate_summed(
        &mut self,
        batch: TokenBatch<'_>,
        scale: f32,
        dropout_seed: Option<u64>,
        ranks: &dyn GradientSum,
    ) -> Result<f64, FusedError> {
        let loss = self.run_reducing(batch, Some(scale), dropout_seed, Some(ranks))?;
        let layout = self.grads.shared_layout();
        for entry in layout.entries() {
            if in_block(entry.slot).is_none()
                && let Some(g) = self.grads.slot_mut(entry.slot).get_mut()
            {
                ranks.sum(g);
            }
        }
        Ok(loss)
    }

    /// Scales the held gradients by `min(1, max_norm / (‖g‖ + 1e-6))`, ‖g‖ the norm of all of
    /// them together (PyTorch's `clip_grad_norm_`), and returns ‖g‖.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        self.allocate_gradients();
        let norm = self.grads.norm();
        let factor = clip_factor(norm, max_norm);
        if factor < 1.0 {
            self.grads.scale(factor as f32);
        }
        norm
    }

    /// Drops the gradients accumulated so far (a step whose update is skipped).
    pub fn discard_gradients(&mut self) {
        self.reset_gradients();
    }

    /// Every held gradient (a trained parameter's: frozen ones have none), in the layout's
    /// order, for `f` to change in place: data-parallel training adds them up over its ranks
    /// between the last micro-batch and [`clip_grad_norm`](Self::clip_grad_norm).
    pub fn for_each_gradient(&mut self, mut f: impl FnMut(&mut [f32])) {
        self.allocate_gradients();
        let layout = self.grads.shared_layout();
        for entry in layout.entries() {
            if let Some(g) = self.grads.slot_mut(entry.slot).get_mut() {
                f(g);
            }
        }
        self.grads_zero = false;
    }

    /// Every weight held here in f32, in the layout's order (a frozen base held in int8 is
    /// not): what a checksum of the weights reads.
    pub fn for_each_weight(&self, mut f: impl FnMut(&[f32])) {
        for entry in self.weights.layout().entries() {
            if let Some(w) = self.weights.slot(entry.slot).get() {
                f(w);
            }
        }
    }

    /// Frees the gradients' buffer while none are held (between steps: a checkpoint, a
    /// sample); the next step allocates it again.
    pub fn release_gradients(&mut self) {
        if self.grads_zero {
            self.grads = Params::default();
        }
    }

    /// The gradients' buffer, zero, if [`release_gradients`](Self::release_gradients) freed it.
    pub(crate) fn allocate_gradients(&mut self) {
        if self.grads.layout().entries().is_empty() {
            self.grads.zero_like(&self.weights);
        }
    }

    /// Sets the held gradients to zero.
    pub(crate) fn reset_gradients(&mut self) {
        self.grads.zero_like(&self.weights);
        self.grads_zero = true;
    }

    /// The gradients accumulated since the last call, as Burn gradients of `gpt`'s parameters;
    /// the held gradients are reset to zero.
    pub fn take_gradients(&mut self, gpt: &Gpt) -> GradientsParams {
        self.allocate_gradients();
        let grads = self.grads.to_gradients(gpt);
        self.reset_gradients();
        grads
    }

    fn run(
        &mut self,
        batch: TokenBatch<'_>,
        scale: Option<f32>,
        dropout_seed: Option<u64>,
    ) -> Result<f64, FusedError> {
        self.run_reducing(batch, scale, dropout_seed, None)
    }

    /// [`run`](Self::run); with `ranks` (and gradients), each block's summed gradient is summed
    /// over them as it is complete (`overlap.rs`).
    fn run_reducing(
        &mut self,
        batch: TokenBatch<'_>,
        scale: Option<f32>,
        dropout_seed: Option<u64>,
        ranks: Option<&dyn GradientSum>,
    ) -> Result<f64, FusedError> {
        self.check(&batch)?;
        let kept = kept_targets(batch.targets)?;
        let grad_scale = scale.map(|s| s / kept as f32);
        let drops = self.dims.dropout > 0.0 || self.weights.lora_dropout() > 0.0;
        let dropout = dropout_seed.filter(|_| drops && scale.is_some());
        let groups = self.work.len().min(batch.batch);
        // The first thread's share goes straight into the held gradients when they are zero
        // (the sum 0 + share is the share, bit for bit): one gradient buffer fewer.
        let direct = grad_scale.is_some() && self.grads_zero;
        if grad_scale.is_some() {
            self.allocate_gradients();
        }
        if direct {
            std::mem::swap(&mut self.grads, &mut self.work[0].grads);
            self.work[0].grads_zero = true;
        }
        let ranks = ranks.filter(|_| grad_scale.is_some());
        let layer_sums = ranks.map(|_| {
            // Over zero gradients thread 0's buffers become the sums (as `direct` above).
            let held = match direct {
                true => Vec::new(),
                false => std::mem::take(&mut self.grads.blocks),
            };
            let layers = self.weights.blocks.len();
            LayerSums::new(self.weights.layout(), held, layers, groups)
        });
        let (dims, weights) = (self.dims, &self.weights);
        let layer_sums_ref = layer_sums.as_ref();
        let jobs = split(&mut self.work[..groups], &batch, layer_sums_ref);
        let sums: Vec<f64> = std::thread::scope(|scope| {
            let reducer = layer_sums_ref
                .zip(ranks)
                .map(|(sums, ranks)| scope.spawn(move || sums.reduce(ranks)));
            let run = move |job: Job<'_>| {
                let _fail = layer_sums_ref.map(FailOnPanic);
                job.run(dims, weights, grad_scale, dropout)
            };
            let mut jobs = jobs.into_iter();
            let here = jobs.next().expect("at least one sequence");
            let handles: Vec<_> = jobs.map(|job| scope.spawn(move || run(job))).collect();
            let mut sums = vec![run(here)];
            sums.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker panicked")),
            );
            if let Some(reducer) = reducer {
                reducer.join().expect("the reducing thread panicked");
            }
            sums
        });
        if direct {
            std::mem::swap(&mut self.grads, &mut self.work[0].grads);
        }
        if let Some(layer_sums) = layer_sums {
            layer_sums.finish(&mut self.grads);
        }
        if grad_scale.is_some() {
            // With the blocks summed as they were complete, the rest is left to add.
            let rest = |slot| ranks.is_none() || in_block(slot).is_none();
            for work in &self.work[usize::from(direct)..groups] {
                self.grads.add_where(&work.grads, rest);
            }
            self.grads_zero = false;
        }
        Ok(sums.iter().sum::<f64>() / kept as f64)
    }

    pub(super) fn check(&self, batch: &TokenBatch<'_>) -> Result<(), FusedError> {
        let cells = batch.batch * batch.seq;
        if batch.inputs.len() != cells || batch.targets.len() != cells || cells == 0 {
            return Err(FusedError::BatchShape {
                inputs: batch.inputs.len(),
                targets: batch.targets.len(),
                batch: batch.batch,
                seq: batch.seq,
            });
        }
        if batch.seq > self.dims.block_size {
            return Err(ModelError::Attention(
                tinygpt_attention::AttentionError::SequenceTooLong {
                    len: batch.seq,
                    max: self.dims.block_size,
                },
            )
            .into());
        }
        let vocab = self.dims.vocab as i64;
        let bad_input = batch.inputs.iter().find(|&&id| !(0..vocab).contains(&id));
        let bad_target = batch
            .targets
            .iter()
            .find(|&&id| id != IGNORE_INDEX && !(0..vocab).contains(&id));
        if let Some(&id) = bad_input.or(bad_target) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab_size: self.dims.vocab,
            }
            .into());
        }
        Ok(())
    }
}

/// `batch` split over the threads' workspaces: contiguous groups of sequences, the first ones
/// one longer when it does not divide; each told of `sums` when the blocks are summed as their
/// backward ends.
fn split<'a>(
    work: &'a mut [Workspace],
    batch: &'a TokenBatch<'a>,
    sums: Option<&'a LayerSums>,
) -> Vec<Job<'a>> {
    let groups = work.len();
    let mut first = 0;
    let mut jobs = Vec::with_capacity(groups);
    for (g, work) in work.iter_mut().enumerate() {
        let seqs = batch.batch / groups + usize::from(g < batch.batch % groups);
        jobs.push(Job {
            work,
            first,
            seqs,
            batch,
            block_done: sums.map(|sums| BlockDone { sums, thread: g }),
        });
        first += seqs;
    }
    jobs
}

/// One block's weights that `lora`'s base holds quantised ([`BaseWeights::held_as`]), and the
/// bytes their blocks take.
fn held_weights(config: &GptConfig, lora: Option<&LoraConfig>) -> (usize, usize) {
    let base = lora.map_or(BaseWeights::F32, |lora| lora.base);
    let held = LoraTarget::all()
        .filter_map(|t| t.shape(config))
        .filter_map(|(n_in, n_out)| {
            let kind = base.held_as(n_in)?;
            Some((
                n_in * n_out,
                n_in * n_out / kind.values() * kind.block_bytes(),
            ))
        });
    held.fold((0, 0), |(w, b), (weights, bytes)| (w + weights, b + bytes))
}

/// AdamW's moments to update (zero, shaped like `weights`, before the first step); copied
/// first if a serialiser still shares them ([`FusedCpu::share_adamw_state`]).
pub(crate) fn moments_mut<'a>(
    moments: &'a mut Option<Arc<Moments>>,
    weights: &Params,
) -> &'a mut Moments {
    let moments = moments.get_or_insert_with(|| Arc::new(Moments::zeros(weights)));
    Arc::make_mut(moments)
}
