//! # Masked (causal) multi-head self-attention, explained
//!
//! A GPT reads a sequence and, at every position `i`, predicts token `i + 1`. Attention is how a
//! position gathers information from others: it scores itself (the *query*) against every
//! position's *key*, turns the scores into weights with a softmax, and takes the weighted sum of
//! the *values*:
//!
//! ```text
//! weights = softmax(Q Kᵀ / √d_head + mask)      [batch, heads, seq, seq]
//! output  = weights · V                         [batch, heads, seq, d_head]
//! ```
//!
//! Training computes all positions at once, so position `i` could read the very token it must
//! predict. The **causal mask** hides every key `j > i` from query `i`; its matrix is
//! upper-triangular (`torch.triu(ones, diagonal=1)`), and the weights that survive form a
//! lower-triangular one (`torch.tril`). The mask goes *before* the softmax: the softmax must
//! share the weight among visible keys only, so the hidden scores become a large negative number
//! whose exponential is 0. Masking *after* the softmax also works if each row is renormalised to
//! sum to 1 again: the two give identical weights ([`mask`] explains why, the tests prove it).
//!
//! What this crate offers:
//! - [`CausalSelfAttention`], a Burn [`Module`](burn::module::Module) made by
//!   [`CausalSelfAttentionConfig::init`]: multi-head, optional key-padding mask, dropout on the
//!   attention weights during training, weights returned for inspection
//!   ([`CausalSelfAttention::forward_with_weights`]): `attention.rs`, the forward on one screen.
//! - Its decode forwards (`decode.rs`): incremental decoding with a [`KvCache`], continuous
//!   batching's rows, and the decode step a GPU captures and replays
//!   ([`CausalSelfAttention::forward_step`]: the position a device tensor, the mask, rotation
//!   and cache row derived from it; `step.rs`).
//! - Three implementations of the core ([`AttentionKernel`]): the explicit one written out as
//!   above, Burn's scaled dot-product attention op (`sdpa`), and on GPUs [`flash`]: the same
//!   attention in one kernel that never writes the `[seq, seq]` weights to memory, with its own
//!   backward. Where a layer runs ([`Kernels`]: Burn's ops or tinygpt's CubeCL kernels) is
//!   decided once, when it is built, from its device; each call then takes what the layer's
//!   [`AttentionKernel`] asks for what the call brings: its [`Pass`] (a training step or
//!   not, said by the caller: [`pass`]) and its padding. A GPU's
//!   decode step attends in one kernel per layer ([`decode_attention`]: a query over a fixed
//!   cache, the keys past its position hidden).
//! - The building blocks on plain score tensors: [`mask::causal_mask`], [`mask::tril`],
//!   [`mask::triu`], [`mask::mask_then_softmax`], [`mask::softmax_then_renormalise`].
//! - The ideas newer GPTs add, each a lesson with its proofs in the tests: [`rope`] (rotary
//!   positions: a rotation that keeps lengths and makes scores depend on distance only),
//!   [`grouped`] (grouped-query attention: fewer key/value heads, the same outputs as multi-head
//!   attention over repeated ones) and [`qk_norm`] (unit-RMS queries and keys: bounded scores);
//!   on GPUs the last two as one kernel on the projection's packed heads ([`packed_qk`]).
//! - [`next_token`]: what attention is trained for: the next-token loss, with PyTorch's
//!   `ignore_index` (−1) for positions that must not count.
//! - [`lora`]: the product of a projection carrying a LoRA adapter whose input is dropped out
//!   while training (PEFT's `lora_dropout`: the frozen matrix sees the whole input).
//!
//! Shapes use `batch` (independent sequences), `seq` (tokens), `heads`, `d_model` (the
//! residual-stream width) and `d_head = d_model / heads`.

mod attention;
mod config;
mod decode;
pub mod decode_attention;
mod error;
pub mod flash;
pub mod grouped;
mod kernels;
mod kv_cache;
pub mod lora;
pub mod mask;
pub mod next_token;
pub mod packed_qk;
pub mod pass;
pub mod qk_norm;
pub mod rope;
mod step;

pub use attention::CausalSelfAttention;
pub use config::{AttentionKernel, CausalSelfAttentionConfig};
pub use error::{AttentionConfigError, AttentionError};
pub use kernels::{DecodeProduct, Kernels, burn_product};
pub use kv_cache::KvCache;
pub use pass::Pass;
pub use step::{StepAt, StepTables};
