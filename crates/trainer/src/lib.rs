//! # tinygpt: train and sample a tiny GPT on any text file
//!
//! The library behind the `tinygpt` binary, for programs that open runs or train without the
//! command line (a server, integration tests). Its rooms, in the order data flows:
//!
//! ```text
//! config/    the run's TOML config (RunConfig, the model's own GptConfig as [model]) and the
//!            presets and corpus built into the binary
//! data/      text -> token files (prepare/) -> tokenizer -> mapped tokens -> batches
//! backend/   --backend: a device and the engine that trains on it (Placement::engine_for)
//! train/     set-up, the loop, reporting; the engine (Burn autodiff or the fused CPU engine),
//!            AdamW, the memory check
//! run/       the run directory: checkpoints, checksums, the writer's lock, metrics, journal
//! decoder.rs the decoder that generate, serve and bench sample with
//! eval.rs, attention_maps.rs   losses over whole splits; attention maps
//! bench.rs, profile.rs, token_cost.rs  speed and memory; the kernels a GPU step launches,
//!            what a sampled token costs a GPU
//! interop/   nanoGPT and Hugging Face models in and out
//! chat/      conversations as a model's text: its chat template (Jinja or a transcript)
//! serve/     the HTTP API and playground over a trained run
//! watch/     a live page of runs as they train (their journal: run/journal.rs)
//! fs.rs      atomic files and directories, which everything above writes with; checksum.rs
//!            SHA-256 in hex
//! ```
//!
//! Dependencies point one way: `data` and `run` never reach into `train`, `train` never into
//! the commands.

pub mod attention_maps;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod checksum;
pub mod config;
pub mod data;
pub mod decoder;
pub mod distributed;
pub mod eval;
pub mod fs;
pub mod interop;
pub mod profile;
pub mod progress;
pub mod run;
pub mod serve;
pub mod token_cost;
pub mod train;
pub mod watch;
