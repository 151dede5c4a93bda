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

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use tinygpt_model::Gpt;

use super::adapters::attach_adapters;
pub use super::files::{Checkpoint, LoraBase, OptimizerFile, TrainState};
pub(crate) use super::files::{OPTIMIZER, STATE, WEIGHTS, WriteFile};
use super::files::{
    read_checkpoint, read_checkpoint_checked, read_checkpoint_streamed, read_state,
    seal_checkpoint, write_checkpoint,
};
use super::lock::RunLock;
use super::streamed;
use super::weights::{check_tensors, load_base_weights, load_weights, load_weights_file_without};
use crate::checksum::sha256_file;
use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::fs::{self, refuse_non_empty, write_atomic};

pub const CONFIG: &str = "config.toml";
pub const TOKENIZER: &str = "tokenizer.json";
pub(crate) const METRICS: &str = "metrics.csv";
pub(crate) const PLOT: &str = "loss.svg";

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
    /// its checksum as it is read through, never held whole; where the checkpoint records each
    /// tensor's (an import's), only the tensors read are checked. A LoRA run, whose adapters merge
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
        let unread = unread.iter().cloned().collect();
        // An import's state holds each tensor's checksum: those read are checked, not the
        // whole file (6.8 GB at SmolLM2-1.7B's shape, of which a decoder from the kept blocks
        // reads a few MB).
        let checked = |dir: &Path| {
            let checkpoint = read_checkpoint_streamed(dir)?;
            let sums = &checkpoint.state.tensors;
            if !sums.is_empty() {
                check_tensors(&dir.join(WEIGHTS), sums, &unread)?;
            }
            Ok(checkpoint)
        };
        let checkpoint = self.first_readable(which, checked)?;
        if let Some(warning) = &checkpoint.warning {
            eprintln!("warning: {warning}");
        }
        let model = self.init_model(device)?;
        let path = checkpoint.dir.join(WEIGHTS);
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

    /// Saves `tensors` (Burn's parameter paths as names, each made as it is written: see
    /// [`streamed`]) as the `which` checkpoint of a new model whose parameter ids, in module
    /// order, are `ids`: an import, which never holds the model whole.
    pub(crate) fn save_tensors(
        &self,
        which: Which,
        tensors: Vec<(String, streamed::Deferred<'_>)>,
        ids: Vec<u64>,
    ) -> Result<()> {
        let weights = |path: &Path| streamed::write(path, tensors);
        let state = TrainState::default();
        self.install(which, |tmp| {
            seal_checkpoint(tmp, weights, ids, None, &state)
        })
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
