//! The run directory: everything needed to sample, evaluate or resume, written atomically.
//!
//! ```text
//! RUN/
//!   config.toml      the resolved run configuration
//!   tokenizer.json   the tokenizer
//!   lock             held by the one process writing the run (holds its id)
//!   metrics.csv      step, train/val loss, lr, tokens, elapsed, skipped steps (one row per eval)
//!   loss.svg         train and val loss against step
//!   best/            weights (model.safetensors) and state.json at the best val loss
//!   last/            the same at the latest save, plus optimizer.bpk (AdamW moments)
//!   prev/            the `last` before it, the fallback when `last` is damaged
//! ```
//!
//! A file is written to a temporary name and renamed over the old one; a checkpoint directory
//! is written as `.last.tmp` (each file flushed to disk, `state.json` last, with the SHA-256 of
//! every file), and swapped in with two renames. Killing the process at any instant leaves
//! either the old or the new checkpoint readable, never a mix; a damaged file is noticed and
//! named when the checkpoint is read.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use serde::{Deserialize, Serialize};
use tinygpt_model::Gpt;

use super::adapters::{attach_adapters, write_adapters};
use super::integrity;
use super::lock::RunLock;
use super::weights::{
    load_base_weights, load_weights, load_weights_file_without, param_ids, write_weights,
};
use crate::checksum::{sha256_file, sha256_hex};
use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::fs::{self, refuse_non_empty, write_atomic, write_synced};

pub const CONFIG: &str = "config.toml";
pub const TOKENIZER: &str = "tokenizer.json";
pub(crate) const METRICS: &str = "metrics.csv";
pub(crate) const PLOT: &str = "loss.svg";
pub(crate) const WEIGHTS: &str = "model.safetensors";
pub(crate) const OPTIMIZER: &str = "optimizer.bpk";
pub(crate) const STATE: &str = "state.json";

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

/// `state.json`: where training stands, and the checksums of its checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    /// The seal of this file (see [`integrity`]); set by [`Run::save`]. Absent in runs written
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
    /// SHA-256 of each other file of the checkpoint, by file name; set by [`Run::save`].
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// A LoRA run's base: its weights are the base run's, `model.safetensors` holds the
    /// adapters alone ([`super::lora`]).
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

/// A loaded run: config, tokenizer and the metadata of the chosen weights.
pub struct Run {
    pub dir: PathBuf,
    pub config: RunConfig,
    pub tokenizer: Tokenizer,
    /// Held while this process writes the run.
    lock: Option<RunLock>,
}

impl Run {
    /// Opens an existing run directory to read it (config and tokenizer; weights are read by
    /// [`load_model`](Self::load_model)). Readers take no lock.
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
            .with_context(|| format!("checkpoint {}: {TOKENIZER} is invalid", dir.display()))?;
        config
            .check_vocab(tokenizer.vocab_size())
            .with_context(|| format!("checkpoint {}: {CONFIG}", dir.display()))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tokenizer,
            lock: None,
        })
    }

    /// Opens an existing run to write it: takes its lock first, so a second writer fails before
    /// reading anything.
    pub(crate) fn open_to_write(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!("run {} does not exist", dir.display());
        }
        let lock = RunLock::acquire(dir)?;
        let mut run = Self::open(dir)?;
        run.lock = Some(lock);
        Ok(run)
    }

    /// Creates a new run directory, refusing one that already holds a run. It is built under a
    /// temporary name (config, tokenizer, then whatever `fill` writes) and renamed into place
    /// only when all of it succeeded: a failed start leaves nothing behind. The run is returned
    /// locked.
    pub fn create(
        dir: &Path,
        config: RunConfig,
        tokenizer: Tokenizer,
        fill: impl FnOnce(&Run) -> Result<()>,
    ) -> Result<Self> {
        refuse_existing(dir)?;
        config.check_vocab(tokenizer.vocab_size())?;
        let name = dir
            .file_name()
            .with_context(|| format!("--out {} must name a directory", dir.display()))?;
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
        let parent = parent.unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let staging = parent.join(format!(
            ".{}.new-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        if staging.exists() {
            std::fs::remove_dir_all(&staging)?;
        }
        std::fs::create_dir(&staging)
            .with_context(|| format!("cannot create run directory {}", staging.display()))?;
        let built = (|| {
            let run = Self {
                lock: Some(RunLock::acquire(&staging)?),
                dir: staging.clone(),
                config,
                tokenizer,
            };
            write_atomic(
                &staging.join(TOKENIZER),
                run.tokenizer.to_json()?.as_bytes(),
            )?;
            write_atomic(&staging.join(CONFIG), run.config.to_toml().as_bytes())?;
            fill(&run)?;
            Ok(run)
        })();
        let placed = built.and_then(|run| {
            std::fs::rename(&staging, dir).map_err(|e| {
                if dir.join(CONFIG).exists() {
                    anyhow::anyhow!("{} already holds a run (created meanwhile)", dir.display())
                } else {
                    anyhow::anyhow!("cannot create run directory {}: {e}", dir.display())
                }
            })?;
            Ok(run)
        });
        match placed {
            Ok(mut run) => {
                run.dir = dir.to_path_buf();
                Ok(run)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&staging);
                Err(e)
            }
        }
    }

    /// Rewrites `config.toml` (after `--resume` changed `max_iters`, say).
    pub(crate) fn write_config(&self) -> Result<()> {
        write_atomic(&self.dir.join(CONFIG), self.config.to_toml().as_bytes())
    }

    /// The `which` checkpoint, verified. A damaged or missing `last` falls back to the previous
    /// one (kept as `prev/`), saying why in [`Checkpoint::warning`]; a damaged `best` is an
    /// error naming the damaged file. `with_optimizer` reads and verifies `optimizer.bpk` too.
    pub fn checkpoint(&self, which: Which, with_optimizer: bool) -> Result<Checkpoint> {
        self.first_readable(which, |dir| read_checkpoint(dir, with_optimizer))
    }

    /// The `which` checkpoint as `read` reads it from its directory: a damaged `last` gives
    /// the previous one, with a warning.
    fn first_readable(
        &self,
        which: Which,
        read: impl Fn(&Path) -> Result<Checkpoint>,
    ) -> Result<Checkpoint> {
        let name = which.dir_name();
        let candidates = match which {
            Which::Best => vec![self.dir.join(name), self.dir.join(".best.old")],
            Which::Last => vec![self.dir.join(name), self.dir.join(PREVIOUS)],
        };
        let mut damage: Option<anyhow::Error> = None;
        for dir in candidates.iter().filter(|d| d.join(STATE).exists()) {
            match read(dir) {
                Ok(mut checkpoint) => {
                    checkpoint.warning = damage.map(|e| {
                        format!(
                            "{e:#}; using the previous checkpoint {} (step {}) instead",
                            dir.display(),
                            checkpoint.state.step
                        )
                    });
                    return Ok(checkpoint);
                }
                Err(e) if which == Which::Last && damage.is_none() => damage = Some(e),
                Err(e) => return Err(damage.unwrap_or(e)),
            }
        }
        Err(damage.unwrap_or_else(|| {
            anyhow::anyhow!(
                "checkpoint {} has no `{name}` weights yet (training saves them at the first eval)",
                self.dir.display()
            )
        }))
    }

    /// The `best` checkpoint's weights file and its checksum, checked against `state.json` by
    /// reading the file through (not into memory): for loading it a tensor at a time
    /// ([`load_base_weights`](super::weights::load_base_weights)). A run written before
    /// checkpoints had checksums gives the file's.
    pub(crate) fn best_weights_file(&self) -> Result<(PathBuf, String)> {
        let dir = self.dir.join(Which::Best.dir_name());
        let (state, path) = (read_state(&dir)?, dir.join(WEIGHTS));
        let sum = sha256_file(&path)?;
        if let Some(expected) = state.files.get(WEIGHTS)
            && *expected != sum
        {
            bail!(
                "{} is damaged: its checksum does not match the one in state.json",
                path.display()
            );
        }
        Ok((path, sum))
    }

    /// The `--backend` the newest readable `last` checkpoint (or `prev`) was trained with, if
    /// it says; a damaged one says nothing here (loading it says why).
    pub(crate) fn trained_backend(&self) -> Option<String> {
        [Which::Last.dir_name(), PREVIOUS]
            .iter()
            .find_map(|name| read_state(&self.dir.join(name)).ok())
            .and_then(|state| state.backend)
    }

    /// Whether any `last` checkpoint was saved (damaged or not): a run stopped before its first
    /// save has none.
    pub(crate) fn has_checkpoint(&self) -> bool {
        [Which::Last.dir_name(), PREVIOUS]
            .iter()
            .any(|name| self.dir.join(name).join(STATE).exists())
    }

    /// Moves a damaged `last` aside (to `last.damaged-<unix seconds>`), so that the next save
    /// does not rotate it over the good `prev`; it stays for inspection. Writers only.
    pub(crate) fn set_aside_damaged_last(&self) -> Result<()> {
        if self.lock.is_none() {
            bail!("internal: only the run's writer may move its checkpoints");
        }
        let last = self.dir.join(Which::Last.dir_name());
        if !last.exists() {
            return Ok(());
        }
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let aside = self
            .dir
            .join(format!("last.damaged-{}", since_epoch.as_secs()));
        std::fs::rename(&last, &aside)
            .with_context(|| format!("cannot move {} aside", last.display()))?;
        eprintln!("note: moved the damaged checkpoint to {}", aside.display());
        Ok(())
    }

    /// The model with the `which` weights, on `device`, and its training state; a LoRA run's
    /// adapters merged into its base's matrices (what sampling, serving and exports read).
    pub fn load_model(&self, which: Which, device: &Device) -> Result<(Gpt, TrainState)> {
        let mut checkpoint = self.checkpoint(which, false)?;
        let model = self.model_from(&mut checkpoint, device)?.merge_lora();
        Ok((model, checkpoint.state))
    }

    /// The `which` checkpoint's state, every file `state.json` lists checked against its
    /// checksum by reading it through (the weights and the optimizer never held): what a run
    /// is and whether its checkpoints are whole, without loading them.
    pub fn verified(&self, which: Which) -> Result<Checkpoint> {
        self.first_readable(which, |dir| read_checkpoint_checked(dir, &[]))
    }

    /// The model with the `which` weights, as [`load_model`](Self::load_model) loads it, but
    /// the parameters named in `unread` (Burn paths) neither read from the file nor made: only
    /// a decoder that takes their values from elsewhere (a GGUF file's kept blocks:
    /// `Matrices::unread_parameters`) may read the model. The weights file is checked against
    /// its checksum as it is read through, never held whole. A LoRA run, whose adapters merge
    /// into its matrices, loads whole.
    pub fn load_model_without(
        &self,
        which: Which,
        device: &Device,
        unread: &[String],
    ) -> Result<(Gpt, TrainState)> {
        if unread.is_empty() || self.config.lora.is_some() {
            return self.load_model(which, device);
        }
        let checkpoint = self.first_readable(which, read_checkpoint_streamed)?;
        if let Some(warning) = &checkpoint.warning {
            eprintln!("warning: {warning}");
        }
        let model = self.init_model(device)?;
        let path = checkpoint.dir.join(WEIGHTS);
        let unread = unread.iter().cloned().collect();
        let model = load_weights_file_without(model, &path, &unread)
            .with_context(|| format!("weights {} do not fit this run's model", path.display()))?;
        Ok((model, checkpoint.state))
    }

    /// A model of this run's config on `device`, its parameters not yet made.
    fn init_model(&self, device: &Device) -> Result<Gpt> {
        let config = self.config.gpt(self.tokenizer.vocab_size());
        config
            .init_with_attention(device, self.config.train.attention_kernel)
            .with_context(|| format!("checkpoint {}: {CONFIG}", self.dir.display()))
    }

    /// The model of `checkpoint` (one of this run's), on `device`: a LoRA run's base with its
    /// adapters attached, not merged (what training continues). Prints the checkpoint's
    /// warning, if any. Takes the checkpoint's weights (left empty), so that the file's bytes
    /// are not held twice while the model is made from them.
    pub(crate) fn model_from(&self, checkpoint: &mut Checkpoint, device: &Device) -> Result<Gpt> {
        if let Some(warning) = &checkpoint.warning {
            eprintln!("warning: {warning}");
        }
        let mut model = self.init_model(device)?;
        let path = checkpoint.dir.join(WEIGHTS);
        let weights = std::mem::take(&mut checkpoint.weights);
        let misfit = || format!("weights {} do not fit this run's model", path.display());
        let model = match (&self.config.lora, &checkpoint.state.lora_base) {
            (None, _) => {
                load_weights(&mut model, weights).with_context(misfit)?;
                model
            }
            (Some(lora), Some(base)) => {
                let base = base_weights(base, &self.dir)?;
                // Its context may be shorter than its base's (a position table cropped).
                let model = load_base_weights(model, &base, true).context("the LoRA run's base")?;
                attach_adapters(model, lora, weights).with_context(misfit)?
            }
            (Some(_), None) => bail!(
                "{} is a LoRA run's checkpoint but names no base run",
                checkpoint.dir.display()
            ),
        };
        Ok(model)
    }

    /// Saves `model` (and, for `last`, the optimizer state) as the `which` checkpoint, with the
    /// checksums of its files. A `last` being replaced is kept as `prev/`.
    pub fn save(
        &self,
        which: Which,
        model: &Gpt,
        optimizer: Option<OptimizerFile<'_>>,
        state: &TrainState,
    ) -> Result<()> {
        self.install(which, |tmp| write_checkpoint(tmp, model, optimizer, state))
    }

    /// The `from` checkpoint saved again as `to` (a new run's two checkpoints, the same
    /// weights): its files hard-linked, not written a second time ([`fs::link_dir`]: a save
    /// never writes a checkpoint's file in place, it replaces the directory).
    pub fn save_as(&self, from: Which, to: Which) -> Result<()> {
        let src = self.dir.join(from.dir_name());
        self.install(to, |tmp| fs::link_dir(&src, tmp))
    }

    /// The `which` checkpoint as `fill` writes it into a temporary directory, swapped in (a
    /// `last` being replaced kept as `prev/`); nothing changed if `fill` fails.
    fn install(&self, which: Which, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let name = which.dir_name();
        let tmp = self.dir.join(format!(".{name}.tmp"));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        let written = fill(&tmp);
        if let Err(e) = written {
            // Frees the space a full disk needs back; the old checkpoint is untouched.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let dst = self.dir.join(name);
        let old = match which {
            Which::Best => self.dir.join(".best.old"),
            Which::Last => self.dir.join(PREVIOUS),
        };
        fs::swap_dir(&tmp, &dst, &old)?;
        if which == Which::Best && old.exists() {
            std::fs::remove_dir_all(&old)?;
        }
        Ok(())
    }
}

/// The base's weights file, refused in one line if its weights are not the ones the LoRA run
/// `dir` started from.
fn base_weights(base: &LoraBase, dir: &Path) -> Result<PathBuf> {
    let lora_run = dir.display();
    let source = Run::open(&base.run).with_context(|| {
        format!(
            "the base of LoRA run {lora_run}, {}, cannot be opened (a LoRA run reads its base's \
             weights where they were when it started)",
            base.run.display()
        )
    })?;
    let (path, sum) = source.best_weights_file()?;
    if sum != base.weights_sha256 {
        bail!(
            "the base of LoRA run {lora_run} has changed: {}'s best weights are not the ones its \
             adapters were trained on (checksum {} expected)",
            base.run.display(),
            base.weights_sha256
        );
    }
    Ok(path)
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

/// The previous `last` checkpoint's directory name.
pub(crate) const PREVIOUS: &str = "prev";

/// Refuses `dir` if it holds a run or anything else.
pub(crate) fn refuse_existing(dir: &Path) -> Result<()> {
    if dir.join(CONFIG).exists() {
        bail!(
            "{} already holds a run: pass --resume to continue it, or choose another --out",
            dir.display()
        );
    }
    refuse_non_empty(dir)
}

/// Writes a checkpoint into the new directory `dir`: weights, optimizer state, and last the
/// sealed `state.json` with their checksums; each file flushed to disk.
fn write_checkpoint(
    dir: &Path,
    model: &Gpt,
    optimizer: Option<OptimizerFile<'_>>,
    state: &TrainState,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut state = state.clone();
    state.files.clear();
    let path = dir.join(WEIGHTS);
    match model.lora_scale() {
        Some(_) => write_adapters(model, &path)?,
        None => write_weights(model, &path)?,
    }
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
    state.param_ids = param_ids(model);
    state.checksum = Some(integrity::placeholder());
    let text = integrity::seal(&serde_json::to_string_pretty(&state)?);
    write_synced(&dir.join(STATE), text.as_bytes())
}

/// The sealed `state.json` of the checkpoint in `dir`.
fn read_state(dir: &Path) -> Result<TrainState> {
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

/// The checkpoint in `dir` without its weights' bytes (nor the optimizer's): the weights file
/// checked against `state.json` by reading it through, for loading it a tensor at a time.
fn read_checkpoint_streamed(dir: &Path) -> Result<Checkpoint> {
    read_checkpoint_checked(dir, &[WEIGHTS])
}

/// The checkpoint in `dir` without its files' bytes, its weights and each of `names` that
/// `state.json` lists (`&[]`: every file it lists) checked against their checksums by reading
/// them through, never held whole.
fn read_checkpoint_checked(dir: &Path, names: &[&str]) -> Result<Checkpoint> {
    let state = read_state(dir)?;
    let path = dir.join(WEIGHTS);
    if !path.exists() {
        bail!("{} is missing", path.display());
    }
    let listed = state.files.iter();
    for (name, expected) in listed.filter(|(n, _)| names.is_empty() || names.contains(&n.as_str()))
    {
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
fn read_checkpoint(dir: &Path, with_optimizer: bool) -> Result<Checkpoint> {
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
