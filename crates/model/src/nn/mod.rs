//! # nn: the model as Burn modules
//!
//! [`Gpt`] (embeddings, blocks, final norm, LM head), its [`Block`] with the attention of
//! `tinygpt_attention` and a [`FeedForward`], the [`Normalization`] each [`Norm`](crate::Norm)
//! names, the next-token loss with `ignore_index` ([`cross_entropy`]), each parameter by its Burn
//! path (`by_path.rs`, from which [`ParamLayout::of`](crate::ParamLayout::of) reads a model), and
//! a `Gpt` as a [`Decoder`](crate::Decoder) and a [`BatchDecoder`](crate::BatchDecoder)
//! (`decode.rs`; on a GPU the recorded steps of `captured.rs` and `rows.rs`).
//!
//! Built from [`crate::arch`]; may import `arch`, `sample` (the decoder traits it implements),
//! `optim` (the layout it reads a model into) and `gpu` (the fused kernels it runs on a GPU);
//! never the CPU engine, which imports it.

mod block;
pub(crate) mod by_path;
mod captured;
mod decode;
mod gpt;
mod loss;
pub(crate) mod norm;
mod record;
mod rows;
mod seeded;

pub use block::{Block, FeedForward};
pub use decode::{DecodeStep, GptBatch};
pub use gpt::Gpt;
pub use loss::{
    IGNORE_INDEX, cross_entropy, cross_entropy_counted, cross_entropy_ops, kept_targets,
};
pub use norm::{Normalization, rms_norm};
pub use seeded::seeded;
