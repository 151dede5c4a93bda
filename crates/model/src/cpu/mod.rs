//! [`FusedCpu`]: the GPT's training step written out by hand for the CPU.
//!
//! Burn's autodiff records every tensor op of [`Gpt::forward`] and replays it backwards, each op
//! a separate pass over memory with a fresh allocation. This module computes the same loss and
//! the same gradients with one hand-written backward per layer (llm.c's approach): activations
//! live in buffers reused from step to step, LayerNorm, GELU, softmax and cross-entropy are one
//! loop each, the matmuls go to `gemm` with AVX-512 kernels where the CPU has them, and the batch
//! is split into contiguous groups of sequences that run on separate threads, their gradients
//! summed in a fixed order.
//!
//! The Burn [`Gpt`] stays the definition of the model. This engine runs only the configs it
//! implements exactly ([`fused_support`], an allow-list over every field of [`GptConfig`]), and
//! the tests check its loss, every gradient, its AdamW and its decoder against Burn's autodiff of
//! [`Gpt::forward`] + [`cross_entropy`], Burn's AdamW and [`Gpt::forward`]. The weights are read
//! from a [`Gpt`]; between reads they may live here, with AdamW's moments, and go back to a
//! [`Gpt`] (and the gradients to Burn as [`GradientsParams`]) when asked.
//!
//! [`cross_entropy`]: crate::cross_entropy

mod adamw;
mod attention;
mod batch_decode;
mod block;
mod cross_entropy;
mod decode;
mod dropout;
mod fast_math;
mod gelu;
mod gelu_tanh;
mod layer_norm;
mod matmul;
mod muon;
mod norm;
mod params;
mod qk_norm;
mod relu2;
mod rms_norm;
mod rope;
mod softcap;
mod swiglu;
mod workspace;

use std::sync::Arc;

use burn::optim::GradientsParams;
use thiserror::Error;

use crate::clip::clip_factor;
use crate::config::GptConfig;
use crate::error::{LossError, ModelError};
use crate::gpt::Gpt;
use crate::layout::ParamLayout;
use crate::loss::{IGNORE_INDEX, kept_targets};
use crate::parts::{Mlp, Norm, Position};
use adamw::Moments;
pub use adamw::{AdamWSettings, MomentState};
pub use batch_decode::FusedBatch;
pub use decode::{FusedDecoder, PREFILL_CHUNK};
pub use muon::{
    MuonSettings, NEWTON_SCHULZ, NEWTON_SCHULZ_EPSILON, NEWTON_SCHULZ_STEPS, VelocityState,
};
use params::Params;
use workspace::{Job, Workspace};

/// Why [`FusedCpu`] cannot run a model or a batch.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FusedError {
    #[error("the fused CPU engine does not implement {0} (--backend flex runs it)")]
    Unsupported(String),
    #[error("inputs and targets hold {inputs} and {targets} ids for a [{batch}, {seq}] batch")]
    BatchShape {
        inputs: usize,
        targets: usize,
        batch: usize,
        seq: usize,
    },
    #[error("the optimizer state does not fit this model: {0}")]
    OptimizerState(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Loss(#[from] LossError),
}

/// A batch on the host: `inputs` and `targets` are `[batch, seq]` row-major; targets may be
/// [`IGNORE_INDEX`].
#[derive(Debug, Clone, Copy)]
pub struct TokenBatch<'a> {
    pub inputs: &'a [i64],
    pub targets: &'a [i64],
    pub batch: usize,
    pub seq: usize,
}

/// The model's sizes, read from its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Dims {
    vocab: usize,
    block_size: usize,
    width: usize,
    heads: usize,
    /// Key/value heads (`heads` without grouped-query attention).
    kv_heads: usize,
    /// The MLP's hidden width, and the columns of its first projection (`2·hidden` for
    /// SwiGLU's gate and up).
    hidden: usize,
    fc_width: usize,
    dropout: f32,
    /// The norms' ε, `layer_norm_eps` in f32 (the kernels' precision).
    epsilon: f32,
    /// The parts the kernels pick between ([`fused_support`] has refused the others).
    norm: Norm,
    /// The MLP's activation; `None`: the blocks have no MLP.
    activation: Option<Act>,
    qk_norm: bool,
    /// Rotary positions' base, with `position = "rope"`.
    rope: Option<f64>,
    /// The logits' soft-cap; 0 = none.
    softcap: f32,
}

impl Dims {
    fn d_head(&self) -> usize {
        self.width / self.heads
    }

    /// Columns of the packed projection: `heads` query, `kv_heads` key, `kv_heads` value heads.
    fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.d_head()
    }

    /// Columns of the queries and keys together: what QK-norm and the rotation touch.
    fn qk_width(&self) -> usize {
        (self.heads + self.kv_heads) * self.d_head()
    }

    /// Columns of the keys (or of the values).
    fn kv_width(&self) -> usize {
        self.kv_heads * self.d_head()
    }
}

impl Dims {
    fn of(gpt: &Gpt) -> Result<Self, FusedError> {
        let config = gpt.config();
        let activation = supported(config)?;
        gpt.check_config()?;
        Ok(Self {
            vocab: config.vocab_size,
            block_size: config.block_size,
            width: config.n_embd,
            heads: config.n_head,
            kv_heads: config.kv_heads(),
            hidden: config.mlp_width(),
            fc_width: config.fc_width(),
            dropout: config.dropout as f32,
            epsilon: config.layer_norm_eps as f32,
            norm: config.norm,
            activation,
            qk_norm: config.qk_norm,
            rope: match config.position {
                Position::Rope => Some(config.rope_theta),
                Position::Learned | Position::None => None,
            },
            softcap: config.logit_softcap as f32,
        })
    }
}

/// Whether the fused engine computes exactly what [`Gpt`] computes for `config`: an allow-list
/// over every field and every part. The sizes, dropout, biases, tying and the norm's ε may take
/// any value; each part ([`crate::parts`]) must be one the kernels implement. A field added to
/// [`GptConfig`], or a variant added to a part, does not compile here until it is placed on one
/// side or the other. (How Burn computes attention, [`Gpt::with_attention_kernel`], is not the
/// model's: the engine has its own attention.)
pub fn fused_support(config: &GptConfig) -> Result<(), FusedError> {
    supported(config).map(|_| ())
}

/// [`fused_support`], returning the MLP's activation the kernels then run (`None`: no MLP).
fn supported(config: &GptConfig) -> Result<Option<Act>, FusedError> {
    let GptConfig {
        vocab_size: _,
        block_size: _,
        n_layer: _,
        n_head: _,
        n_embd: _,
        dropout: _,
        bias: _,
        tie_embeddings: _,
        position,
        norm,
        mlp,
        layer_norm_eps: _,
        // The hidden width is a size, and the init is not computed here.
        mlp_hidden: _,
        proj_init: _,
        rope_theta: _,
        // `attention.rs` and the decoder read each query head's key/value head in place.
        n_kv_head: _,
        // Each has its kernels: `qk_norm.rs`, `softcap.rs`.
        qk_norm: _,
        logit_softcap: _,
    } = config;
    match position {
        // `embed` reads the table when there is one; `rope.rs` rotates queries and keys.
        Position::Learned | Position::Rope | Position::None => {}
    }
    match norm {
        // `layer_norm.rs`, `rms_norm.rs`, and the identity (`norm.rs`).
        Norm::Layer | Norm::Rms | Norm::RmsUnit | Norm::None => {}
    }
    Ok(match mlp {
        Mlp::Gelu => Some(Act::Gelu),
        Mlp::GeluTanh => Some(Act::GeluTanh),
        Mlp::Relu2 => Some(Act::Relu2),
        Mlp::SwiGlu => Some(Act::SwiGlu),
        // The block adds nothing after attention (`block.rs`).
        Mlp::None => None,
    })
}

/// The MLP activations the kernels implement: `gelu.rs`, `gelu_tanh.rs`, `relu2.rs`,
/// `swiglu.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Gelu,
    GeluTanh,
    Relu2,
    SwiGlu,
}

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
    dims: Dims,
    /// The weights, laid out by the model's [`ParamLayout`]; the gradients and moments follow
    /// the same layout.
    weights: Params,
    grads: Params,
    /// AdamW's moments, from the first [`FusedCpu::adamw_step`] or a loaded state.
    moments: Option<Moments>,
    /// Muon's momentum for the matrices it updates, from [`FusedCpu::use_muon`].
    muon: Option<muon::Velocities>,
    work: Vec<Workspace>,
}

impl FusedCpu {
    /// Reads `gpt`'s sizes and weights. `threads` (≥ 1) is how many groups a batch is split into;
    /// results are reproducible for a given value.
    pub fn new(gpt: &Gpt, threads: usize) -> Result<Self, FusedError> {
        let dims = Dims::of(gpt)?;
        let weights = Params::read(gpt, Arc::new(ParamLayout::of(gpt)));
        let mut grads = Params::default();
        grads.zero_like(&weights);
        let work = (0..threads.max(1)).map(|_| Workspace::default()).collect();
        Ok(Self {
            dims,
            weights,
            grads,
            moments: None,
            muon: None,
            work,
        })
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

    /// One AdamW step on the held weights along the held gradients (Burn's `AdamW` arithmetic,
    /// bit for bit), then the gradients are reset to zero.
    pub fn adamw_step(&mut self, lr: f64, settings: &AdamWSettings) {
        let weights = &mut self.weights;
        let moments = self.moments.get_or_insert_with(|| Moments::zeros(weights));
        moments.step(weights, &self.grads, settings, lr);
        self.grads.zero_like(&self.weights);
    }

    /// AdamW's state of every parameter it updates (all but Muon's matrices; empty before the
    /// first step), in the layout's order.
    pub fn adamw_state(&self) -> Vec<MomentState> {
        let Some(moments) = &self.moments else {
            return Vec::new();
        };
        let muon = |i: usize| self.muon.as_ref().is_some_and(|m| m.updates(i));
        let entries = self.weights.layout().entries();
        entries
            .iter()
            .zip(&moments.time)
            .enumerate()
            .filter(|(i, _)| !muon(*i))
            .map(|(_, (entry, &time))| MomentState {
                id: entry.id,
                shape: entry.shape.clone(),
                time,
                moment_1: moments.m.slot(entry.slot).to_vec(),
                moment_2: moments.v.slot(entry.slot).to_vec(),
            })
            .collect()
    }

    /// Continues from a saved AdamW state (e.g. Burn's, on resume): one entry per parameter
    /// AdamW updates (all but Muon's matrices, after [`use_muon`](Self::use_muon)), or none. A
    /// state that does not fit is refused, and what was held stays.
    pub fn load_adamw_state(&mut self, states: Vec<MomentState>) -> Result<(), FusedError> {
        let layout = self.weights.layout();
        let muon = |i: usize| self.muon.as_ref().is_some_and(|m| m.updates(i));
        let ordered = layout
            .gather_where(states, |i| !muon(i))
            .map_err(|e| FusedError::OptimizerState(e.to_string()))?;
        if ordered.is_empty() {
            self.moments = None;
            return Ok(());
        }
        // Muon's matrices keep zero moments, never stepped.
        let mut moments = Moments::zeros(&self.weights);
        for ((entry, state), time) in layout.entries().iter().zip(ordered).zip(&mut moments.time) {
            if let Some(state) = state {
                *moments.m.slot_mut(entry.slot) = state.moment_1;
                *moments.v.slot_mut(entry.slot) = state.moment_2;
                *time = state.time;
            }
        }
        self.moments = Some(moments);
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

    /// Scales the held gradients by `min(1, max_norm / (‖g‖ + 1e-6))`, ‖g‖ the norm of all of
    /// them together (PyTorch's `clip_grad_norm_`), and returns ‖g‖.
    pub fn clip_grad_norm(&mut self, max_norm: f64) -> f64 {
        let norm = self.grads.norm();
        let factor = clip_factor(norm, max_norm);
        if factor < 1.0 {
            self.grads.scale(factor as f32);
        }
        norm
    }

    /// Drops the gradients accumulated so far (a step whose update is skipped).
    pub fn discard_gradients(&mut self) {
        self.grads.zero_like(&self.weights);
    }

    /// The gradients accumulated since the last call, as Burn gradients of `gpt`'s parameters;
    /// the held gradients are reset to zero.
    pub fn take_gradients(&mut self, gpt: &Gpt) -> GradientsParams {
        let grads = self.grads.to_gradients(gpt);
        let weights = &self.weights;
        self.grads.zero_like(weights);
        grads
    }

    fn run(
        &mut self,
        batch: TokenBatch<'_>,
        scale: Option<f32>,
        dropout_seed: Option<u64>,
    ) -> Result<f64, FusedError> {
        self.check(&batch)?;
        let kept = kept_targets(batch.targets)?;
        let grad_scale = scale.map(|s| s / kept as f32);
        let dropout = dropout_seed.filter(|_| self.dims.dropout > 0.0 && scale.is_some());
        let groups = self.work.len().min(batch.batch);
        let (dims, weights) = (self.dims, &self.weights);
        // Contiguous groups of sequences, the first ones one longer when it does not divide.
        let mut jobs = Vec::with_capacity(groups);
        let mut first = 0;
        for (g, work) in self.work.iter_mut().take(groups).enumerate() {
            let seqs = batch.batch / groups + usize::from(g < batch.batch % groups);
            jobs.push(Job {
                work,
                first,
                seqs,
                batch: &batch,
            });
            first += seqs;
        }
        let sums: Vec<f64> = std::thread::scope(|scope| {
            let mut jobs = jobs.into_iter();
            let here = jobs.next().expect("at least one sequence");
            let handles: Vec<_> = jobs
                .map(|job| scope.spawn(move || job.run(dims, weights, grad_scale, dropout)))
                .collect();
            let mut sums = vec![here.run(dims, weights, grad_scale, dropout)];
            sums.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("worker panicked")),
            );
            sums
        });
        if grad_scale.is_some() {
            for work in &self.work[..groups] {
                self.grads.add(&work.grads);
            }
        }
        Ok(sums.iter().sum::<f64>() / kept as f64)
    }

    fn check(&self, batch: &TokenBatch<'_>) -> Result<(), FusedError> {
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
