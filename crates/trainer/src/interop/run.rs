//! What an import is asked ([`ImportOptions`]) and what it makes: the run config of an imported
//! model, and the run directory holding it ([`Imported`] reports it).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use tinygpt_model::{Gpt, GptConfig};

use super::chat_files;
use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::run::checkpoint::{Run, TrainState, Which};
use crate::run::param_ids;
use crate::run::streamed::Deferred;

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
    /// The run a PEFT adapter directory adapts.
    pub base: Option<PathBuf>,
}

/// What was imported, for the command's report.
pub struct Imported {
    pub format: &'static str,
    pub config: RunConfig,
    pub vocab_size: usize,
    /// Anything the user should know (padding, training progress in the source).
    pub notes: Vec<String>,
}

/// The run config of an imported model: its architecture `model` (from the source's own
/// config), `rows` embedding rows, `tokenizer`, and tinygpt's defaults for the rest. Fewer tokens
/// than rows is a padded vocabulary (`model.vocab_size`, and a note saying so), more is an error;
/// both name `source`, the file the architecture comes from.
pub(super) fn imported_config(
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
pub(super) fn hf_run_config(
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

/// Creates the run directory `out` holding `model` as both checkpoints (one weights file on
/// the disk, linked into both).
pub(super) fn create_run(
    out: &Path,
    config: RunConfig,
    tokenizer: Tokenizer,
    model: &Gpt,
) -> Result<()> {
    let state = TrainState::default();
    Run::create(out, config, tokenizer, |run| {
        run.save(Which::Last, model, None, &state)?;
        run.save_as(Which::Last, Which::Best)
    })?;
    Ok(())
}

/// Creates the run directory `out` for a model of `gpt` from its `tensors` (Burn's paths, each
/// made as it is written: the model is never held whole), as both checkpoints (one weights file
/// on the disk, linked into both).
pub(super) fn create_run_streamed(
    out: &Path,
    config: RunConfig,
    tokenizer: Tokenizer,
    gpt: &GptConfig,
    tensors: Vec<(String, Deferred<'_>)>,
) -> Result<()> {
    // The parameters of a model made by `init` are drawn when first used: only their ids are
    // read here.
    let ids = param_ids(&gpt.init(&Device::flex())?);
    Run::create(out, config, tokenizer, |run| {
        run.save_tensors(Which::Last, tensors, ids)?;
        run.save_as(Which::Last, Which::Best)
    })?;
    Ok(())
}
