//! Sampling from a trained model, for `generate`, `serve` and `bench`: the decoder the
//! placement's engine calls for (the fused CPU decoder, or Burn's on the model's device).

pub mod decoder;

pub use decoder::{decoder, decoder_for};
