//! # tinygpt-model: the GPT
//!
//! A decoder-only transformer on Burn, in the parts of nanoGPT (learned positions, LayerNorm, a
//! GELU MLP, GPT-2's initialisation) and of the models since (rotary positions, RMSNorm,
//! QK-norm, grouped key/value heads, ReLU² and SwiGLU MLPs, a logit soft-cap, zero-initialised
//! projections), each chosen in [`GptConfig`]. The crate is in rooms, each a module whose doc
//! says what it owns and what it may import; lower rooms never import higher ones:
//!
//! 0. **`fast_math`**: `exp`, `tanh` and the normal CDF in plain arithmetic, and the
//!    `vectorized!` macro that compiles a loop for the CPU's vector width: what the kernels
//!    and the sampler's loops over a vocabulary vectorise with.
//! 1. **`arch`**: what the model is, with no Burn in it: [`GptConfig`] with its presets
//!    ([`GptConfig::baby`], [`GptConfig::shakespeare_char`], [`GptConfig::modern`],
//!    [`GptConfig::minimal`]), its [`parts`], and [`parameter_table`]: every parameter under
//!    Burn's and nanoGPT's names.
//! 2. **`sample`**: how a next token is chosen, for every engine: [`GenerateOptions`]
//!    (temperature, top-k, top-p, repetition penalty, stop sequences), [`generate`] and
//!    [`score`] over any [`Decoder`], and the [`BatchDecoder`] a server drives.
//! 3. **`optim`**: [`ParamLayout`], the one flat layout of the parameters every optimizer
//!    works on, the optimizers' settings and state, gradient clipping.
//! 4. **[`gpu`]**: LayerNorm, RMSNorm, the cross-entropy, the embedding's gradient and AdamW as
//!    CubeCL kernels with their backward, which the model takes on a GPU; decoding's products
//!    of a few rows ([`gpu::rows`]); and [`gpu::Kernels`], which kernels a model runs, decided
//!    once where it is built.
//! 5. **`nn`**: the Burn modules: [`Gpt::forward`] (`[batch, seq]` token ids to
//!    `[batch, seq, vocab]` logits), [`Block`], [`FeedForward`], [`Normalization`],
//!    [`cross_entropy`] with [`IGNORE_INDEX`] = -1 (PyTorch's `ignore_index`); and in `decode/`
//!    a [`Gpt`] as a [`Decoder`] ([`Gpt::decoder`]) and a [`BatchDecoder`] ([`GptBatch`]), the
//!    ways a GPU decodes ([`Decoding`]).
//! 6. **`cpu`**: the fused CPU engine: [`FusedCpu`], the same loss and gradients by
//!    hand-written kernels (tested against Burn's autodiff), and [`FusedDecoder`] /
//!    [`FusedBatch`], decoding with a KV cache.
//!
//! Everything a user of the crate needs is re-exported here, and the rooms are private except
//! [`gpu`], whose kernels the trainer (its device AdamW) and the tests call directly.

mod arch;
mod cpu;
mod error;
mod fast_math;
pub mod gpu;
mod nn;
mod optim;
mod sample;

pub use arch::parts;
pub use arch::{
    BaseWeights, BlockSlot, Factor, GptConfig, LoraConfig, LoraTarget, ParamName, Slot,
    TrainedPart, parameter_table, trained_beside,
};
pub use cpu::{
    FusedBatch, FusedCpu, FusedDecoder, FusedError, LentWeights, MomentEntry, PREFILL_CHUNK,
    SharedMoments, TokenBatch, WeightFormat, q8_0_block, weight_bytes_per_token,
};
pub use error::{GenerateError, GptConfigError, LossError, ModelError};
pub use gpu::sum_all;
pub use nn::{
    Block, DecodeStep, Decoding, FeedForward, Gpt, GptBatch, IGNORE_INDEX, Ids, Normalization,
    adapter_path, befores, cross_entropy, cross_entropy_counted, cross_entropy_ops, kept_targets,
    rms_norm, seeded,
};
pub use optim::{
    AdamWSettings, LayoutEntry, LayoutError, LrRatios, MomentState, MuonSettings, NEWTON_SCHULZ,
    NEWTON_SCHULZ_EPSILON, NEWTON_SCHULZ_STEPS, ParamLayout, VelocityState, clip_factor_on_device,
};
pub use sample::{
    BatchDecoder, Continuation, Decoder, Feed, Finish, GenerateOptions, Pick, Picked, Replay,
    Sampled, generate, generate_batch, generate_cancellable, host_reads, score,
};
