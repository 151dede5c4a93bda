//! # tinygpt-model: the GPT
//!
//! nanoGPT's architecture on Burn: token + learned position embeddings, `n_layer` pre-LayerNorm
//! blocks of [causal self-attention](tinygpt_attention) and a GELU MLP on residual branches, a
//! final LayerNorm, and a linear LM head (optionally tied to the token embedding). Initialised as
//! GPT-2: weights ~ N(0, 0.02), residual projections ~ N(0, 0.02/√(2·n_layer)), biases 0.
//!
//! - [`GptConfig`] with presets [`GptConfig::baby`], [`GptConfig::shakespeare_char`] and the
//!   bare [`GptConfig::minimal`];
//! - [`Gpt::forward`]: `[batch, seq]` token ids to `[batch, seq, vocab]` logits;
//! - [`cross_entropy`] with [`IGNORE_INDEX`] = -1, PyTorch's `ignore_index` semantics;
//! - [`gpu`]: LayerNorm and the cross-entropy as fused CubeCL kernels with their backward,
//!   which the model takes on a GPU;
//! - [`FusedCpu`]: the same loss and gradients by hand-written, fused CPU kernels (AVX-512
//!   matmuls, the batch split over threads), tested against Burn's autodiff, for the configs
//!   [`fused_support`] allows;
//! - [`parameter_table`]: every parameter under Burn's and nanoGPT's names, in one order, and
//!   [`ParamLayout`]: the present ones end to end, the flat layout every optimizer works on;
//! - [`generate`] ([`Gpt::generate`] on Burn, or [`FusedDecoder`] on the CPU): temperature,
//!   top-k, top-p, repetition penalty, stop sequences, streamed through a callback, with a KV
//!   cache.

mod batch;
mod block;
mod clip;
mod config;
mod continuation;
mod cpu;
mod device_pick;
mod draw;
mod error;
mod generate;
mod gpt;
pub mod gpu;
mod layout;
mod loss;
pub mod norm;
mod options;
mod parameters;
pub mod parts;
mod sampler;

pub use batch::{BatchDecoder, GptBatch};
pub use block::{Block, Mlp};
pub use clip::{CLIP_EPSILON, clip_factor, clip_factor_on_device};
pub use config::{Activation, GptConfig};
pub use continuation::{Continuation, Feed, Finish};
pub use cpu::{
    AdamWSettings, FusedBatch, FusedCpu, FusedDecoder, FusedError, MomentState, MuonSettings,
    NEWTON_SCHULZ, NEWTON_SCHULZ_EPSILON, NEWTON_SCHULZ_STEPS, PREFILL_CHUNK, TokenBatch,
    VelocityState, fused_support,
};
pub use device_pick::{Pick, Picked};
pub use draw::Sampled;
pub use error::{GenerateError, GptConfigError, LossError, ModelError};
pub use generate::{Decoder, generate, generate_cancellable, score};
pub use gpt::Gpt;
pub use layout::{LayoutEntry, LayoutError, ParamLayout};
pub use loss::{
    IGNORE_INDEX, cross_entropy, cross_entropy_counted, cross_entropy_ops, kept_targets,
};
pub use options::GenerateOptions;
pub use parameters::{BlockSlot, ParamName, Slot, parameter_table};
