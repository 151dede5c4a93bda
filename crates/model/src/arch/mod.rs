//! # arch: what the model is
//!
//! The architecture as a description, with no Burn module and no engine in it: [`GptConfig`]
//! (the sizes, and every size derived from them, defined here only), its [`parts`] (positions,
//! norm, MLP, projection init: each an enum whose variants are the choices), the older TOML
//! spellings still read (`legacy.rs`), and the parameter table ([`parameter_table`]): every
//! parameter a config implies, under Burn's and nanoGPT's names, with its shape.
//!
//! Everything else reads from here: the Burn modules ([`crate::nn`]) build what it describes, the
//! engines decide by matching on it, the trainer's imports and exports name tensors through the
//! table. It imports nothing from the crate but its errors.

mod config;
mod legacy;
mod lora;
mod parameters;
pub mod parts;
pub(crate) mod q8_0;
pub mod quants;

pub use config::GptConfig;
pub use lora::{BaseWeights, Factor, LoraConfig, LoraTarget, TrainedPart};
pub use parameters::{BlockSlot, ParamName, Slot, parameter_table, trained_beside};
pub use parts::{Mlp, Norm, Position};
pub use quants::BlockType;
