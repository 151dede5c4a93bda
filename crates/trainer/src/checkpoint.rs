//! The run directory: everything needed to sample, evaluate or resume, written atomically.
//!
//! ```text
//! RUN/
//!   config.toml      the resolved run configuration
//!   tokenizer.json   the tokenizer
//!   metrics.csv      step, train/val loss, lr, tokens, elapsed (one row per eval)
//!   loss.svg         train and val loss against step
//!   best/            weights (model.safetensors) and state.json at the best val loss
//!   last/            the same at the latest save, plus optimizer.bpk (AdamW moments)
//! ```
//!
//! A file is written to a temporary name and renamed over the old one; a checkpoint directory
//! is written as `.last.tmp`, and swapped in with two renames (the old one is kept as
//! `.last.old` until the new one is in place). Killing the process at any instant leaves either
//! the old or the new checkpoint readable, never a mix.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};
use tinygpt_model::Gpt;

use crate::config::RunConfig;
use crate::tokenizer::Tokenizer;

pub const CONFIG: &str = "config.toml";
pub const TOKENIZER: &str = "tokenizer.json";
pub const METRICS: &str = "metrics.csv";
pub const PLOT: &str = "loss.svg";
pub const WEIGHTS: &str = "model.safetensors";
pub const OPTIMIZER: &str = "optimizer.bpk";
pub const STATE: &str = "state.json";

/// Which saved weights to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// The weights with the lowest validation loss.
    Best,
    /// The latest weights.
    Last,
}

impl Which {
    fn dir_name(self) -> &'static str {
        match self {
            Self::Best => "best",
            Self::Last => "last",
        }
    }
}

/// `state.json`: where training stands.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TrainState {
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
    /// Parameter ids in module order: safetensors has no place for them, and the optimizer's
    /// state is keyed by them.
    pub param_ids: Vec<u64>,
}

/// A loaded run: config, tokenizer and the metadata of the chosen weights.
pub struct Run {
    pub dir: PathBuf,
    pub config: RunConfig,
    pub tokenizer: Tokenizer,
}

impl Run {
    /// Opens an existing run directory (config and tokenizer; weights are read by
    /// [`load_model`](Self::load_model)).
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!(
                "checkpoint {} does not exist (expected a run directory written by `tinygpt train`)",
                dir.display()
            );
        }
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).with_context(|| {
                format!(
                    "checkpoint {} is incomplete: cannot read {name}",
                    dir.display()
                )
            })
        };
        let config = RunConfig::from_toml(&read(CONFIG)?)
            .with_context(|| format!("checkpoint {}: {CONFIG} is invalid", dir.display()))?;
        let tokenizer = Tokenizer::from_json(&read(TOKENIZER)?)
            .with_context(|| format!("checkpoint {}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tokenizer,
        })
    }

    /// Creates a new run directory, refusing one that already holds a run.
    pub fn create(dir: &Path, config: RunConfig, tokenizer: Tokenizer) -> Result<Self> {
        if dir.join(CONFIG).exists() {
            bail!(
                "{} already holds a run: pass --resume to continue it, or choose another --out",
                dir.display()
            );
        }
        if dir
            .read_dir()
            .is_ok_and(|mut entries| entries.next().is_some())
        {
            bail!(
                "{} exists and is not empty: choose another --out (nothing was written)",
                dir.display()
            );
        }
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create run directory {}", dir.display()))?;
        write_atomic(&dir.join(TOKENIZER), tokenizer.to_json()?.as_bytes())?;
        // Written last: its presence marks a complete run directory.
        write_atomic(&dir.join(CONFIG), config.to_toml().as_bytes())?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tokenizer,
        })
    }

    /// Rewrites `config.toml` (after `--resume` changed `max_iters`, say).
    pub fn write_config(&self) -> Result<()> {
        write_atomic(&self.dir.join(CONFIG), self.config.to_toml().as_bytes())
    }

    /// The directory of the `which` checkpoint, falling back to the copy kept during a swap.
    pub fn checkpoint_dir(&self, which: Which) -> Result<PathBuf> {
        let name = which.dir_name();
        let dir = self.dir.join(name);
        if dir.join(STATE).exists() {
            return Ok(dir);
        }
        let old = self.dir.join(format!(".{name}.old"));
        if old.join(STATE).exists() {
            return Ok(old);
        }
        bail!(
            "checkpoint {} has no `{name}` weights yet (training saves them at the first eval)",
            self.dir.display()
        )
    }

    pub fn state(&self, which: Which) -> Result<TrainState> {
        let path = self.checkpoint_dir(which)?.join(STATE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{} is corrupt", path.display()))
    }

    /// The model with the `which` weights, on `device`.
    pub fn load_model(&self, which: Which, device: &Device) -> Result<(Gpt, TrainState)> {
        let dir = self.checkpoint_dir(which)?;
        let state = self.state(which)?;
        let config = self.config.gpt(self.tokenizer.vocab_size());
        let mut model = config
            .init(device)
            .with_context(|| format!("checkpoint {}: {CONFIG}", self.dir.display()))?;
        let path = dir.join(WEIGHTS);
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        load_weights(&mut model, bytes)
            .with_context(|| format!("weights {} do not fit this run's model", path.display()))?;
        Ok((model, state))
    }

    /// Saves `model` (and, for `last`, the optimizer state) as the `which` checkpoint.
    pub fn save(
        &self,
        which: Which,
        model: &Gpt,
        optimizer: Option<&[u8]>,
        state: &TrainState,
    ) -> Result<()> {
        let name = which.dir_name();
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let old = self.dir.join(format!(".{name}.old"));
        let dst = self.dir.join(name);
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        std::fs::write(tmp.join(WEIGHTS), weights_bytes(model)?)?;
        if let Some(optimizer) = optimizer {
            std::fs::write(tmp.join(OPTIMIZER), optimizer)?;
        }
        let mut state = state.clone();
        state.param_ids = param_ids(model);
        std::fs::write(tmp.join(STATE), serde_json::to_string_pretty(&state)?)?;
        if dst.exists() {
            if old.exists() {
                std::fs::remove_dir_all(&old)?;
            }
            std::fs::rename(&dst, &old)?;
        }
        std::fs::rename(&tmp, &dst)?;
        if old.exists() {
            std::fs::remove_dir_all(&old)?;
        }
        Ok(())
    }

    /// The saved optimizer state of `last`.
    pub fn optimizer_bytes(&self) -> Result<Vec<u8>> {
        let path = self.checkpoint_dir(Which::Last)?.join(OPTIMIZER);
        std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
    }
}

/// `model` as safetensors bytes (Burn's store; parameter paths as tensor names).
pub fn weights_bytes(model: &Gpt) -> Result<Vec<u8>> {
    let mut store = SafetensorsStore::from_bytes(None);
    model
        .save_into(&mut store)
        .map_err(|e| anyhow::anyhow!("cannot serialise the weights: {e}"))?;
    store
        .get_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the weights: {e}"))
}

/// Loads safetensors `bytes` into `model`; every tensor must be present with the right shape.
pub fn load_weights(model: &mut Gpt, bytes: Vec<u8>) -> Result<()> {
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .allow_partial(true)
        .validate(false);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("the file is not valid safetensors ({e})"))?;
    check_applied(result)
}

/// `from`'s weights into `to` (same architecture), wherever each lives: the values are read on
/// `from`'s device (so a seeded CPU initialisation happens there) and created on `to`'s, with
/// `to`'s parameter ids and gradient tracking.
pub fn copy_weights(from: &Gpt, to: &mut Gpt) -> Result<()> {
    check_applied(to.apply(from.collect(None, None, false), None, None, false))
}

/// Every tensor applied, none missing, none left over.
fn check_applied(result: burn::store::ApplyResult) -> Result<()> {
    if let Some(error) = result.errors.first() {
        bail!("{error}");
    }
    if let Some((path, _)) = result.missing.first() {
        bail!("tensor `{path}` is missing");
    }
    if let Some(path) = result.unused.first() {
        bail!("unexpected tensor `{path}` (another architecture?)");
    }
    Ok(())
}

/// Parameter ids in module order.
pub fn param_ids(model: &Gpt) -> Vec<u64> {
    struct Ids(Vec<u64>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.id.val());
        }
    }
    let mut ids = Ids(Vec::new());
    model.visit(&mut ids);
    ids.0
}

/// Gives `model`'s parameters the ids they had when saved, so the optimizer state applies.
pub fn restore_param_ids(model: Gpt, ids: &[u64]) -> Result<Gpt> {
    struct Assign<'a>(std::slice::Iter<'a, u64>, bool);
    impl ModuleMapper for Assign<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let Some(&id) = self.0.next() else {
                self.1 = false;
                return param;
            };
            let (_, value, mapper) = param.consume();
            Param::from_mapped_value(ParamId::from(id), value, mapper)
        }
    }
    let mut assign = Assign(ids.iter(), true);
    let model = model.map(&mut assign);
    if !assign.1 || assign.0.next().is_some() {
        bail!("the checkpoint's parameter list does not match the model");
    }
    Ok(model)
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
