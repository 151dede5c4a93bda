//! `tinygpt import` / `tinygpt export`: models in and out of the formats other GPT code uses.
//!
//! - [`nanogpt`]: nanoGPT's `ckpt.pt` (a PyTorch zip-pickle: `model`, `model_args`, …) and its
//!   `meta.pkl` char maps, read without Python.
//! - [`hf`]: Hugging Face GPT-2 directories (`config.json`, `model.safetensors` or
//!   `pytorch_model.bin`, `tokenizer.json`), read and written.
//! - [`llama`]: Hugging Face Llama-family directories (`LlamaForCausalLM`: SmolLM2, TinyLlama),
//!   read and written.
//! - [`sidecar`]: tinygpt's own exchange file, nanoGPT-named safetensors plus a JSON sidecar.
//!
//! All three name tensors as nanoGPT does; [`weights`] maps those names onto the model crate's
//! parameter table and checks every shape against the model the imported config describes.
//! An import builds a complete run directory or nothing.

mod chat_files;
pub mod foreign;
pub mod hf;
pub mod llama;
pub mod nanogpt;
pub mod sidecar;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use tinygpt_model::{Gpt, GptConfig};

pub use sidecar::{export, sidecar_path};

use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::run::checkpoint::{self, Run, TrainState, Which};

/// What `tinygpt import` reads.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// A nanoGPT `ckpt.pt`, a Hugging Face directory, or an exported `.safetensors` file.
    pub from: PathBuf,
    /// nanoGPT's `meta.pkl` (char vocabularies).
    pub meta: Option<PathBuf>,
    /// A Hugging Face `tokenizer.json` (GPT-2's BPE for nanoGPT checkpoints trained on it).
    pub tokenizer: Option<PathBuf>,
    /// The context of an imported Llama-family model (`None`: its own, up to
    /// [`llama::DEFAULT_BLOCK`]).
    pub block_size: Option<usize>,
}

/// What was imported, for the command's report.
pub struct Imported {
    pub format: &'static str,
    pub config: RunConfig,
    pub vocab_size: usize,
    /// Anything the user should know (padding, training progress in the source).
    pub notes: Vec<String>,
}

/// Imports `options.from` into a new run directory `out`: `best` and `last` both hold the
/// imported weights, with no optimizer state.
pub fn import(options: &ImportOptions, out: &Path) -> Result<Imported> {
    checkpoint::refuse_existing(out)?;
    let from = &options.from;
    if !from.exists() {
        bail!("{} does not exist", from.display());
    }
    if from.is_dir() {
        if options.meta.is_some() {
            bail!("--meta goes with a nanoGPT ckpt.pt, not a Hugging Face directory");
        }
        let config = hf_config(from)?;
        if llama::is_llama(&config) {
            let tokenizer = options.tokenizer.as_deref();
            return llama::import(from, config, tokenizer, options.block_size, out);
        }
        if options.block_size.is_some() {
            bail!(
                "--block-size goes with a Llama-family directory (GPT-2's positions are a table)"
            );
        }
        return hf::import(from, config, options.tokenizer.as_deref(), out);
    }
    if options.block_size.is_some() {
        bail!("--block-size goes with a Llama-family directory");
    }
    if from.extension().is_some_and(|e| e == "safetensors") {
        if !sidecar_path(from).exists() {
            bail!(
                "{} has no sidecar {} (written by `tinygpt export`); for a Hugging Face model, \
                 pass its directory",
                from.display(),
                sidecar_path(from).display()
            );
        }
        if options.meta.is_some() || options.tokenizer.is_some() {
            bail!(
                "--meta and --tokenizer go with a nanoGPT ckpt.pt; the sidecar holds the tokenizer"
            );
        }
        return sidecar::import(from, out);
    }
    nanogpt::import(from, options, out)
}

/// The `config.json` of the Hugging Face directory `dir`, as JSON.
fn hf_config(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} is not a Hugging Face model directory: cannot read config.json",
            dir.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is invalid ({e})", path.display()))
}

/// The run config of an imported model: its architecture `model` (from the source's own
/// config), `rows` embedding rows, `tokenizer`, and tinygpt's defaults for the rest. Fewer tokens
/// than rows is a padded vocabulary (`model.vocab_size`, and a note saying so), more is an error;
/// both name `source`, the file the architecture comes from.
fn imported_config(
    model: GptConfig,
    tokenizer: &Tokenizer,
    rows: usize,
    source: &Path,
) -> Result<(RunConfig, Option<String>)> {
    let tokens = tokenizer.vocab_size();
    if tokens > rows {
        bail!(
            "the tokenizer has {tokens} tokens but {} has only {rows} embedding rows: they do \
             not belong together",
            source.display()
        );
    }
    let padded = rows > tokens;
    let mut config = RunConfig {
        model: model.with_vocab_size(if padded { rows } else { 0 }),
        ..RunConfig::default()
    };
    config.data.tokenizer = tokenizer.kind_setting();
    config
        .validate()
        .with_context(|| format!("{}", source.display()))?;
    let note = padded.then(|| {
        format!(
            "the model's vocabulary is padded to {rows} rows; the tokenizer has {tokens} tokens"
        )
    });
    Ok((config, note))
}

/// [`imported_config`] for the Hugging Face directory `dir` (whose `config.json` is `config`),
/// with its chat template, end-of-turn tokens and notes.
fn hf_run_config(
    model: GptConfig,
    tokenizer: &Tokenizer,
    rows: usize,
    dir: &Path,
    config: &serde_json::Value,
) -> Result<(RunConfig, Vec<String>)> {
    let (mut run_config, note) = imported_config(model, tokenizer, rows, &dir.join("config.json"))?;
    let (chat, mut notes) = chat_files::read(dir, config, tokenizer)?;
    run_config.chat = chat;
    notes.splice(0..0, note);
    Ok((run_config, notes))
}

/// Creates the run directory `out` holding `model` as both checkpoints.
fn create_run(out: &Path, config: RunConfig, tokenizer: Tokenizer, model: &Gpt) -> Result<()> {
    let state = TrainState::default();
    Run::create(out, config, tokenizer, |run| {
        run.save(Which::Best, model, None, &state)?;
        run.save(Which::Last, model, None, &state)
    })?;
    Ok(())
}
