//! # tinygpt: train and sample a tiny GPT on any text file
//!
//! The library behind the `tinygpt` binary, for programs that open runs or train without the
//! command line (a server, integration tests). Data flows through it as:
//!
//! ```text
//! corpus (data) -> tokenizer -> batches (data) -> engine: loss, gradients, AdamW (engine, optim)
//!   -> checkpoints (checkpoint) -> generate / eval / attention / export (eval, inspect, interop)
//! ```
//!
//! - [`config::RunConfig`]: the run's TOML configuration; [`presets`]: the built-in configs and
//!   corpus;
//! - [`session::Trainer`]: a training run as named steps (open, step, evaluate, checkpoint,
//!   report) over an [`engine::Engine`], which owns the weights and optimizer state;
//! - [`backend::Backend`]: the `--backend` names, each a device and an engine
//!   ([`backend::Placement`]);
//! - [`checkpoint::Run`]: a run directory, written atomically, checksummed ([`integrity`]) and
//!   locked by its one writer ([`lock`]);
//! - [`serve`]: the HTTP API and playground over a trained run.

pub mod backend;
pub mod bench;
pub mod byte_level_bpe;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod cuda;
pub mod data;
pub mod device_adamw;
pub mod documents;
pub mod engine;
pub mod eval;
pub mod inspect;
pub mod integrity;
pub mod interop;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod optim;
pub mod prepare;
pub mod presets;
pub mod progress;
pub mod serve;
pub mod session;
pub mod tokenizer;
pub mod tokens;
