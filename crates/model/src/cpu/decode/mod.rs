//! Decoding on the fused engine: one sequence ([`FusedDecoder`]: a prompt in chunks of
//! [`PREFILL_CHUNK`], then one token a step against its KV cache) and a server's many
//! ([`FusedBatch`]: each stream's single tokens through the weights together). Both run the
//! training step's block forward (`cpu/block.rs`) without dropout; `cache.rs` is the KV cache
//! they share.

mod attend;
mod batch;
mod cache;
mod decoder;
mod plan;
mod quant;

pub use batch::FusedBatch;
pub use decoder::{FusedDecoder, PREFILL_CHUNK};
pub use plan::{BlockPlan, BlockType, FileBlocks, Matrices, Segment, Storage, WeightPlan};
pub(crate) use quant::RowWeights;
pub use quant::{WeightFormat, weight_bytes_per_token};
