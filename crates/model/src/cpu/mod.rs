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
//! The Burn [`Gpt`](crate::Gpt) stays the definition of the model. This engine implements
//! every part of [`GptConfig`](crate::GptConfig) exactly (`dims.rs` destructures every field and
//! matches on every part, so a new one does not build until it is placed), and the tests check its
//! loss, every gradient, its AdamW and Muon and its decoders against Burn's autodiff of
//! [`Gpt::forward`](crate::Gpt::forward) + [`cross_entropy`](crate::cross_entropy), Burn's
//! optimizers and `Gpt::forward`. The weights are read from a `Gpt`; between reads they may live
//! here, with the optimizer's state, and go back to a `Gpt` (and the gradients to Burn as
//! `GradientsParams`) when asked.
//!
//! The room: this facade and what all of it shares (`dims.rs`: the sizes and parts the kernels
//! read; `params.rs`: the weights as flat buffers; `frozen.rs`: a LoRA run's base held in int8; `block.rs`: one block's forward and backward; `adapters.rs`: the LoRA adapters beside its matrices; `product.rs`: how a block multiplies by a matrix;
//! `error.rs`; `spin_pool.rs`: the spinning helper threads that split one sequence's products),
//! then three sub-rooms, each importing only what is above it here and the rooms
//! above `cpu` (arch, nn, sample, optim):
//! - `kernels/`: one file per kernel family, forward and backward side by side (llm.c's layout);
//! - `train/`: the training step ([`FusedCpu`]), its per-thread workspaces, AdamW and Muon;
//! - `decode/`: decoding one sequence ([`FusedDecoder`]) and many ([`FusedBatch`]).

mod adapters;
mod block;
mod buffer;
mod decode;
mod dims;
mod error;
mod frozen;
mod kernels;
mod params;
mod product;
mod spin_pool;
mod train;

pub use decode::{
    BlockPlan, BlockType, FileBlocks, FusedBatch, FusedDecoder, Matrices, PREFILL_CHUNK, Segment,
    Storage, WeightFormat, WeightPlan, weight_bytes_per_token,
};
pub use error::FusedError;
pub use kernels::q4_0::q4_0_block;
pub use kernels::q5_0::q5_0_block;
pub use kernels::q8::q8_0_block;
pub use train::{FusedCpu, GradientSum, LentWeights, MomentEntry, SharedMoments, TokenBatch};
