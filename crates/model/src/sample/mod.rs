//! # sample: how the next token is chosen, for every engine
//!
//! The sampler's settings ([`GenerateOptions`]: temperature, top-k, top-p, repetition penalty,
//! stop sequences), the draw itself (`sampler.rs` and `draw.rs` on the host, `device_pick.rs`
//! where the logits live on a GPU), one sequence's progress ([`Continuation`]: the window, the
//! stop sequences held back), and the two decoder traits every engine implements: [`Decoder`]
//! (one sequence: [`generate`], [`score`]) and [`BatchDecoder`] (a server's many).
//!
//! Knows no model: it may import the crate's errors, [`crate::fast_math`] (the exponentials
//! over a vocabulary) and Burn's tensors (a device pick), nothing else of the crate. [`crate::nn`] and [`crate::cpu`] implement its traits.

mod batch;
mod continuation;
mod decoder;
mod device_pick;
mod draw;
mod options;
mod reads;
mod sampler;

pub(crate) use batch::check_feeds;
pub use batch::{BatchDecoder, generate_batch};
pub use continuation::{Continuation, Feed, Finish};
pub use decoder::{Decoder, Replay, generate, generate_cancellable, score};
pub use device_pick::{Pick, Picked};
pub use draw::Sampled;
pub use options::GenerateOptions;
pub use reads::host_reads;
pub(crate) use reads::read_f32;
