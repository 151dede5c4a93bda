//! The run directory, everything needed to sample, evaluate or resume a run:
//!
//! ```text
//! adapters.rs    a LoRA run's checkpoint file: the adapters alone
//! checkpoint.rs  the layout (config.toml, tokenizer.json, best/, last/, prev/, data/) and its
//!                atomic checkpoints
//! files.rs       a checkpoint's files written, sealed, read back and checked
//! integrity.rs   SHA-256 seals of every checkpoint file
//! lock.rs        the one process that writes a run
//! metrics.rs     metrics.csv and loss.svg
//! streamed.rs    a weights file written a tensor at a time, each made as it is written
//! weights.rs     weights as safetensors bytes, and the parameter ids AdamW's state is keyed by
//! ```
//!
//! Files are written with [`crate::fs`]: a crash at any instant leaves a readable run.

pub mod adapters;
pub mod checkpoint;
mod files;
pub mod integrity;
pub mod journal;
pub mod lock;
pub mod metrics;
pub(crate) mod streamed;
pub mod weights;

pub use checkpoint::{Run, TrainState, Which};
pub use weights::{copy_weights, load_weights, param_ids, restore_param_ids, weights_bytes};
