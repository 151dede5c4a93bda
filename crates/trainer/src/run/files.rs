//! A checkpoint directory's files: `state.json` ([`TrainState`]), written with the weights and
//! the optimizer's state and sealed by their checksums, read back and checked against them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tinygpt_model::Gpt;

use super::adapters::write_adapters;
use super::integrity;
use super::weights::{TensorSums, param_ids, write_weights};
use crate::checksum::{sha256_file, sha256_hex};
use crate::fs::write_synced;

pub(crate) const WEIGHTS: &str = "model.safetensors";
pub(crate) const OPTIMIZER: &str = "optimizer.bpk";
pub(crate) const STATE: &str = "state.json";

/// `state.json`: where training stands, and the checksums of its checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    /// The seal of this file (see [`integrity`](super::integrity)); set by [`Run::save`](super::Run::save). Absent in runs written
    /// before checkpoints had checksums: those load unverified. Serialised first, as the seal
    /// requires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Optimizer steps done.
    pub step: usize,
    /// Tokens consumed by training so far.
    pub tokens: u64,
    /// Training wall time so far, in seconds.
    pub elapsed_s: f64,
    pub best_val_loss: Option<f64>,
    pub best_step: Option<usize>,
    /// The latest estimates.
    pub train_loss: Option<f64>,
    pub val_loss: Option<f64>,
    /// Steps whose update was skipped because the loss or gradient norm was not finite.
    #[serde(default)]
    pub skipped_steps: u64,
    /// Parameter ids in module order: safetensors has no place for them, and the optimizer's
    /// state is keyed by them.
    pub param_ids: Vec<u64>,
    /// SHA-256 of each other file of the checkpoint, by file name; set by [`Run::save`](super::Run::save).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// SHA-256 of each tensor's bytes in the weights file, by name, where the checkpoint was
    /// written a tensor at a time (an import): a load that reads only some of its tensors (a
    /// quantised file's run decoding from its kept blocks) checks those, not the whole file.
    /// Absent in other checkpoints and in runs imported before 2026-12-08.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tensors: BTreeMap<String, String>,
    /// A LoRA run's base: its weights are the base run's, `model.safetensors` holds the
    /// adapters alone ([`crate::run::adapters`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora_base: Option<LoraBase>,
    /// The `--backend` the run was trained with (`auto` included): what `--resume` takes
    /// unless given another, so that a run continues on its own engine. Absent in runs written
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// Where a LoRA run's base weights are: a run directory, and the SHA-256 of its `best`
/// checkpoint's weights when the LoRA run started (checked at every load).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraBase {
    pub run: PathBuf,
    pub weights_sha256: String,
}

/// A checkpoint read and verified against its checksums.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub state: TrainState,
    /// `model.safetensors`.
    pub weights: Vec<u8>,
    /// `optimizer.bpk`, when asked for and present.
    pub optimizer: Option<Vec<u8>>,
    /// Why an older checkpoint was taken instead of the one asked for.
    pub warning: Option<String>,
}

impl Checkpoint {
    /// The checksum of the weights: the one `state.json` lists, or (a run written before
    /// checkpoints had checksums) computed.
    pub fn weights_checksum(&self) -> String {
        match self.state.files.get(WEIGHTS) {
            Some(sum) => sum.clone(),
            None => sha256_hex(&self.weights),
        }
    }
}

/// Where a checkpoint's optimizer state comes from: bytes in hand, or what writes the file
/// itself ([`Engine::saving`](crate::train::Engine::saving)).
pub enum OptimizerFile<'a> {
    Bytes(&'a [u8]),
    Writer(WriteFile<'a>),
}

/// What writes a file at the path it is given, once.
pub(crate) type WriteFile<'a> = Box<dyn FnOnce(&Path) -> Result<()> + 'a>;

/// Writes a checkpoint into the new directory `dir`: weights, optimizer state, and last the
/// sealed `state.json` with their checksums; each file flushed to disk.
pub(super) fn write_checkpoint(
    dir: &Path,
    model: &Gpt,
    optimizer: Option<OptimizerFile<'_>>,
    state: &TrainState,
) -> Result<()> {
    let weights = |path: &Path| {
        match model.lora_scale() {
            Some(_) => write_adapters(model, path)?,
            None => write_weights(model, path)?,
        }
        Ok(TensorSums::new())
    };
    seal_checkpoint(dir, weights, param_ids(model), optimizer, state)
}

/// A checkpoint in `dir`: its weights file as `weights` writes it, for a model whose parameter
/// ids are `ids`, the optimizer's file, and the sealed state naming every file's checksum.
pub(super) fn seal_checkpoint(
    dir: &Path,
    weights: impl FnOnce(&Path) -> Result<TensorSums>,
    ids: Vec<u64>,
    optimizer: Option<OptimizerFile<'_>>,
    state: &TrainState,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut state = state.clone();
    state.files.clear();
    let path = dir.join(WEIGHTS);
    state.tensors = weights(&path)?;
    state.files.insert(WEIGHTS.to_string(), sha256_file(&path)?);
    let path = dir.join(OPTIMIZER);
    let sum = match optimizer {
        None => None,
        Some(OptimizerFile::Bytes(bytes)) => {
            write_synced(&path, bytes)?;
            Some(sha256_hex(bytes))
        }
        Some(OptimizerFile::Writer(write)) => {
            write(&path).with_context(|| format!("cannot write {}", path.display()))?;
            Some(sha256_file(&path)?)
        }
    };
    if let Some(sum) = sum {
        state.files.insert(OPTIMIZER.to_string(), sum);
    }
    state.param_ids = ids;
    state.checksum = Some(integrity::placeholder());
    let text = integrity::seal(&serde_json::to_string_pretty(&state)?);
    write_synced(&dir.join(STATE), text.as_bytes())
}

/// The sealed `state.json` of the checkpoint in `dir`.
pub(super) fn read_state(dir: &Path) -> Result<TrainState> {
    let path = dir.join(STATE);
    let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let damaged = |why: String| anyhow::anyhow!("{} is damaged: {why}", path.display());
    let text = String::from_utf8(bytes).map_err(|_| damaged("it is not text".into()))?;
    let state: TrainState =
        serde_json::from_str(&text).map_err(|e| damaged(format!("not valid ({e})")))?;
    if let Some(seal) = &state.checksum
        && !integrity::seal_holds(&text, seal)
    {
        return Err(damaged("its checksum does not match".into()));
    }
    Ok(state)
}

/// The checkpoint in `dir` without its weights' bytes (nor the optimizer's), for loading them a
/// tensor at a time: the weights file checked against `state.json` by reading it through, or,
/// where the state records each tensor's checksum ([`TrainState::tensors`]), left to the load.
pub(super) fn read_checkpoint_streamed(dir: &Path) -> Result<Checkpoint> {
    // An import's state holds each tensor's checksum: the load checks those it reads, and the
    // weights file is not read through here.
    checked(dir, |state, name| {
        name == WEIGHTS && state.tensors.is_empty()
    })
}

/// The checkpoint in `dir` without its files' bytes, its weights and each of `names` that
/// `state.json` lists (`&[]`: every file it lists) checked against their checksums by reading
/// them through, never held whole.
pub(super) fn read_checkpoint_checked(dir: &Path, names: &[&str]) -> Result<Checkpoint> {
    checked(dir, |_, name| names.is_empty() || names.contains(&name))
}

/// The checkpoint in `dir` without its files' bytes, each file `state.json` lists that
/// `check(state, name)` picks checked against its checksum by reading it through.
fn checked(dir: &Path, check: impl Fn(&TrainState, &str) -> bool) -> Result<Checkpoint> {
    let state = read_state(dir)?;
    let path = dir.join(WEIGHTS);
    if !path.exists() {
        bail!("{} is missing", path.display());
    }
    for (name, expected) in state.files.iter().filter(|(n, _)| check(&state, n)) {
        let path = dir.join(name);
        if !path.exists() {
            bail!("{} is missing (state.json lists it)", path.display());
        }
        if sha256_file(&path)? != *expected {
            bail!(
                "{} is damaged: its checksum does not match the one in state.json",
                path.display()
            );
        }
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        state,
        weights: Vec::new(),
        optimizer: None,
        warning: None,
    })
}

/// Reads the checkpoint in `dir` and checks every file against `state.json`.
pub(super) fn read_checkpoint(dir: &Path, with_optimizer: bool) -> Result<Checkpoint> {
    let state = read_state(dir)?;
    let read = |name: &str| -> Result<Option<Vec<u8>>> {
        let path = dir.join(name);
        let expected = state.files.get(name);
        if !path.exists() {
            if expected.is_some() {
                bail!("{} is missing (state.json lists it)", path.display());
            }
            return Ok(None);
        }
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if let Some(expected) = expected
            && sha256_hex(&bytes) != *expected
        {
            bail!(
                "{} is damaged: its checksum does not match the one in state.json",
                path.display()
            );
        }
        Ok(Some(bytes))
    };
    let weights =
        read(WEIGHTS)?.with_context(|| format!("{} is missing", dir.join(WEIGHTS).display()))?;
    let optimizer = if with_optimizer {
        read(OPTIMIZER)?
    } else {
        None
    };
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        state,
        weights,
        optimizer,
        warning: None,
    })
}
