//! # nn: the model as Burn modules
//!
//! [`Gpt`] (embeddings, blocks, final norm, LM head), its [`Block`] with the attention of
//! `tinygpt_attention` and a [`FeedForward`], the [`Normalization`] each [`Norm`](crate::Norm)
//! names, the next-token loss with `ignore_index` ([`cross_entropy`]), each parameter by its Burn
//! path (`by_path.rs`, from which [`ParamLayout::of`](crate::ParamLayout::of) reads a model), and
//! a `Gpt` decoding as a [`Decoder`](crate::Decoder) and a [`BatchDecoder`](crate::BatchDecoder)
//! (`decode/`: the decode forwards, and on a GPU the steps captured as device graphs).
//!
//! `gpt.rs` and `block.rs` are the training forward, one screen each; everything only decoding
//! runs is in `decode/`.
//!
//! Built from [`crate::arch`]; may import `arch`, `sample` (the decoder traits it implements),
//! `optim` (the layout it reads a model into) and `gpu` (the fused kernels it runs on a GPU);
//! never the CPU engine, which imports it.

pub(crate) mod block;
pub(crate) mod by_path;
mod decode;
mod decoding;
pub(crate) mod gpt;
mod lora;
mod loss;
pub(crate) mod norm;
mod seeded;

pub use block::{Block, FeedForward};
pub use decode::{GptBatch, Ids, befores};
pub use decoding::{DecodeStep, Decoding};
pub use gpt::Gpt;
pub use lora::adapter_path;
pub use loss::{
    IGNORE_INDEX, cross_entropy, cross_entropy_counted, cross_entropy_ops, kept_targets,
};
pub use norm::{Normalization, rms_norm};
pub use seeded::seeded;
