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
//!    [`GptConfig::minimal`]), its [`parts`], and [`names::parameter_table`]: every parameter
//!    under Burn's and nanoGPT's names.
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
//! What a user of the crate calls is re-exported here; the rooms are private except [`gpu`],
//! whose kernels the trainer (its device AdamW) and the tests call directly. Three modules
//! gather what the tinygpt trainer needs beyond that: [`names`] (every parameter's names),
//! [`step`] (the pieces of a training step it assembles) and [`decoding`] (below the decoders).

mod arch;
mod cpu;
mod error;
mod fast_math;
pub mod gpu;
mod nn;
mod optim;
mod sample;

pub use arch::parts;
pub use arch::{BaseWeights, GptConfig, LoraConfig, LoraTarget};
pub use cpu::{
    BlockPlan, BlockType, FileBlocks, FusedBatch, FusedCpu, FusedDecoder, FusedError, GradientSum,
    Matrices, Segment, Storage, TokenBatch, WeightFormat, WeightPlan,
};
pub use error::{GenerateError, GptConfigError, LossError, ModelError};
pub use fast_math::{InstructionSet, instruction_set};
pub use nn::{
    Block, Decoding, FeedForward, Gpt, GptBatch, IGNORE_INDEX, Normalization, cross_entropy, seeded,
};
pub use optim::{
    AdamWSettings, LayoutEntry, LayoutError, LrRatios, MomentState, MuonSettings, ParamLayout,
    VelocityState,
};
pub use sample::{
    BatchDecoder, Continuation, Decoder, Finish, GenerateOptions, Sampled, generate,
    generate_batch, generate_cancellable, score,
};
/// Whether a forward is part of a training step, said at each call ([`Gpt::forward`]).
pub use tinygpt_attention::Pass;

/// Every parameter under the names it goes by: its place in the model ([`Slot`](names::Slot)),
/// Burn's path, nanoGPT's and Hugging Face's names ([`parameter_table`](names::parameter_table)),
/// PEFT's for the adapters: what importers, exporters and optimizer groups match on.
pub mod names {
    pub use crate::arch::{
        BlockSlot, Factor, ParamName, Slot, TrainedPart, parameter_table, trained_beside,
    };
    pub use crate::nn::adapter_path;
}

/// The pieces of a training step that the tinygpt trainer puts together itself: the loss over
/// the kept targets and its count (and RMSNorm) by Burn's ops, clipping on the device, Muon's Newton–Schulz constants, and
/// what the fused engine lends Burn's model ([`LentWeights`](step::LentWeights)) or shares with
/// a checkpoint writer ([`SharedMoments`](step::SharedMoments)).
pub mod step {
    pub use crate::cpu::{LentWeights, MomentEntry, SharedMoments};
    /// RMSNorm by Burn's ops, what the fused GPU kernel ([`gpu::rms_norm`](crate::gpu::rms_norm))
    /// is tested against.
    pub use crate::nn::rms_norm as rms_norm_ops;
    pub use crate::nn::{cross_entropy_counted, cross_entropy_ops, kept_targets};
    pub use crate::optim::{
        NEWTON_SCHULZ, NEWTON_SCHULZ_EPSILON, NEWTON_SCHULZ_STEPS, clip_factor_on_device,
    };
}

/// Below [`Decoder`] and [`BatchDecoder`]: a step's inputs ([`Ids`](decoding::Ids)), how a
/// server's batcher feeds and replays streams, the sampler on the device, and what decoding
/// costs (host reads, weight bytes a token, the prefill chunk, GGUF's `Q8_0` block).
pub mod decoding {
    pub use crate::cpu::{
        PREFILL_CHUNK, q4_0_block, q5_0_block, q8_0_block, weight_bytes_per_token,
    };
    pub use crate::nn::{DecodeStep, Ids, befores};
    pub use crate::sample::{Feed, Pick, Picked, Replay, host_reads};
}
