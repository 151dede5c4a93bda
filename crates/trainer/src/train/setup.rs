//! Set-up of a training run, resolved once and in one direction: the config (a new run, a
//! resumed one, or one fine-tuned from another run), then its tokenizer and data, the memory
//! check, the weights and optimizer, the engine, and last the run directory. Everything that can
//! fail fails before a new run directory is created.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use tinygpt_model::Gpt;

use super::engine;
use super::memory;
use super::optim::{Optimizer, load_optimizer, optimizer};
use super::session::{Trainer, evaluates_at};
use super::snapshot;
use crate::backend::{Backend, EngineKind, Placement};
use crate::config::presets::ConfigSource;
use crate::config::{RunConfig, UpdateKind};
use crate::data::tokenizer::Tokenizer;
use crate::data::{Dataset, corpus, mix};
use crate::distributed::Ranks;
use crate::run::checkpoint::{self, LoraBase, Run, TrainState, Which};
use crate::run::journal::Journal;
use crate::run::metrics::Metrics;

/// The RNG stream of the initial weights (far above any other stream).
const INIT_STREAM: u64 = 1 << 22;
/// The RNG stream of a LoRA run's adapters.
const LORA_STREAM: u64 = INIT_STREAM + 1;

/// Only these may change when resuming; anything else would make it another run.
const CHANGEABLE_ON_RESUME: [&str; 12] = [
    "train.max_iters",
    "data.path",
    "train.eval_interval",
    "train.log_interval",
    "train.nonfinite_limit",
    // Checkpoints are f32 whatever the step computed in.
    "train.dtype",
    // How attention is computed, not what (`model.kernel` is its older name).
    "train.attention_kernel",
    "model.kernel",
    // How conversations are written for serving; a chat run's data was rendered at its start.
    "chat.template",
    "chat.bos_token",
    "chat.eos_token",
    "chat.stop",
];

/// What to train: a new run from a config, or the run in `out` continued.
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// The config (a new run); `None` = the `default` preset.
    pub config: Option<ConfigSource>,
    /// `section.key=value` overrides.
    pub overrides: Vec<String>,
    /// The run directory (default: `runs/<config name>`).
    pub out: Option<PathBuf>,
    pub backend: Backend,
    /// Continue the run in `out` from its last checkpoint.
    pub resume: bool,
    /// Fine-tune: start from this run's best weights, with its tokenizer and architecture
    /// (`model.dropout` stays this config's, and a shorter `model.block_size` set in
    /// `overrides` is taken) and a fresh optimizer.
    pub init_from: Option<PathBuf>,
    /// The ranks training the run with this process (rank 0), when there are several.
    pub ranks: Option<Ranks>,
}

impl Trainer {
    /// Set-up, in this order: the config with its tokenizer and data, the memory check, the
    /// weights and optimizer, the engine, and last the run directory.
    pub fn open(options: &TrainOptions) -> Result<Self> {
        // Over ranks, a GPU a rank: the host's local rank picks it.
        let local_rank = options.ranks.as_ref().map_or(0, |r| r.local_rank());
        let (dir, data, backend, placement) = if options.resume {
            let (run, data) = resume_run(options)?;
            let (backend, placement) = resumed_placement(&run, options.backend, local_rank)?;
            (RunDir::Existing(run), data, backend, placement)
        } else {
            // Before the corpus is prepared: a backend that cannot start says so at once.
            let placement = options.backend.placement_for(local_rank)?;
            let (dir, data) = new_run(options)?;
            (dir, data, options.backend, placement)
        };
        let (config, tokenizer) = dir.config_and_tokenizer();
        let sample_prompt = snapshot::sample_prompt(config, tokenizer, &data)?;
        let (kind, engine_note) =
            placement.engine_for(config.train.dtype, UpdateKind::of(config))?;
        if let Some(ranks) = &options.ranks {
            super::ranks::refuse_undealt(ranks, config)?;
        }
        let memory = memory_check(config, tokenizer.vocab_size(), kind, &placement)?;
        let (model, optim, mut state) = weights(&dir, &placement.device.clone().autodiff())?;
        state.backend = Some(backend.name().to_string());
        let model = placement.model(model);
        let config = config.clone();
        let optimizer = Optimizer::for_run(&config, &model, optim);
        let ranks = options.ranks.as_ref();
        let settings = match ranks {
            Some(ranks) => engine::Settings::for_ranks(&config, ranks),
            None => engine::Settings::of(&config),
        };
        let mut engine = engine::open(&placement, kind, model, optimizer, settings, ranks)?;
        let notes = placement
            .note
            .clone()
            .into_iter()
            .chain(engine_note)
            .collect();
        let run = dir.into_run()?;
        if let Some(ranks) = ranks {
            let tokenizer = &run.tokenizer;
            super::ranks::Handoff::send(ranks, &config, tokenizer, backend, engine.as_mut())?;
            super::ranks::check_data(ranks, &data, &config)?;
        }
        let metrics = Metrics::open(&run.dir)?;
        let evaluates_first = evaluates_at(&config, state.step);
        let journal = Journal::open(&run.dir, state.step, evaluates_first)?;
        Ok(Self {
            run,
            config,
            data,
            engine,
            settled: state.step,
            state,
            metrics,
            journal,
            sample_prompt,
            device: placement.device,
            device_name: placement.device_name,
            notes,
            memory,
            skipped_in_a_row: 0,
            resumed: options.resume,
            new_weights: !options.resume && options.init_from.is_none(),
            ranks: options.ranks.clone(),
            checkpointed: false,
            stop_asked: false,
        })
    }
}

/// The backend `--resume` continues `run` on, started: the one given, or (`auto`) the one the
/// run was trained with, so that it continues on its own engine (another is the same run only
/// to float rounding).
fn resumed_placement(run: &Run, given: Backend, local_rank: usize) -> Result<(Backend, Placement)> {
    let recorded = match (given, run.trained_backend()) {
        (Backend::Auto, Some(name)) => name,
        _ => return Ok((given, given.placement_for(local_rank)?)),
    };
    let elsewhere = || {
        format!(
            "{} was trained with --backend {recorded}, which cannot start here; give --backend \
             to continue it on another (the same run to float rounding)",
            run.dir.display()
        )
    };
    let backend = Backend::from_name(&recorded).ok_or_else(|| anyhow::anyhow!(elsewhere()))?;
    let placement = backend.placement_for(local_rank);
    Ok((backend, placement.with_context(elsewhere)?))
}

/// The run directory a session trains: one being continued, or one to create once set-up has
/// succeeded.
enum RunDir {
    Existing(Run),
    New {
        out: PathBuf,
        config: RunConfig,
        tokenizer: Tokenizer,
        /// The corpus's token files, to move into the run directory.
        prepared: Option<tempfile::TempDir>,
        /// The run whose weights it starts from (`--init-from`).
        init: Option<Box<Run>>,
    },
}

impl RunDir {
    fn config_and_tokenizer(&self) -> (&RunConfig, &Tokenizer) {
        match self {
            Self::Existing(run) => (&run.config, &run.tokenizer),
            Self::New {
                config, tokenizer, ..
            } => (config, tokenizer),
        }
    }

    /// The run: the one continued, or the new one created now, its prepared corpus moved in.
    fn into_run(self) -> Result<Run> {
        match self {
            Self::Existing(run) => Ok(run),
            Self::New {
                out,
                config,
                tokenizer,
                prepared,
                ..
            } => Run::create(&out, config, tokenizer, |run| match prepared {
                Some(prepared) => corpus::replace_dir(prepared, &run.dir.join(corpus::RUN_DATA)),
                None => Ok(()),
            }),
        }
    }
}

/// The weights the run starts from on `device`, with their optimizer and training state: the
/// `last` checkpoint of a run continued; for a new run (or one stopped before its first
/// checkpoint) the seeded initialisation, or when fine-tuning the source run's best weights
/// (LoRA adapters attached with `[lora]`).
fn weights(dir: &RunDir, device: &Device) -> Result<(Gpt, ModuleOptimizer, TrainState)> {
    if let RunDir::Existing(run) = dir
        && run.has_checkpoint()
    {
        return saved_model(run, device);
    }
    let (config, tokenizer) = dir.config_and_tokenizer();
    let vocab = tokenizer.vocab_size();
    let mut state = TrainState::default();
    let mut model = match dir {
        RunDir::New {
            init: Some(source), ..
        } => {
            let (model, base) = source_model(source, config, vocab, device)?;
            state.lora_base = config.lora.as_ref().map(|_| base);
            model
        }
        _ => initial_model(config, vocab, device)?,
    };
    if let Some(lora) = &config.lora {
        // The adapters' `A` factors drawn from the seed; `B` starts at zero.
        let _streams = tinygpt_model::seeded(device, mix(config.train.seed, 0, LORA_STREAM));
        model = model.with_lora(lora)?;
    }
    let optim = optimizer(config, &model);
    Ok((model, optim, state))
}

/// A model of `config` on `device` holding `source`'s best weights (a LoRA run's merged), and
/// where they came from. They are read into it from the file's bytes: no random
/// initialisation drawn, no second model.
fn source_model(
    source: &Run,
    config: &RunConfig,
    vocab: usize,
    device: &Device,
) -> Result<(Gpt, LoraBase)> {
    let kernel = config.train.attention_kernel;
    let mut model = config.gpt(vocab).init_with_attention(device, kernel)?;
    let (model, weights_sha256) = match source.config.lora {
        // The init refuses a LoRA run as a base: this is a full fine-tune of its merged model.
        Some(_) => {
            let (merged, _) = source.load_model(Which::Best, &Device::flex())?;
            crate::run::weights::copy_weights(&merged, &mut model)?;
            (model, String::new())
        }
        None => {
            let (path, sum) = source.best_weights_file()?;
            // A LoRA run's base is read as the engine takes it, a tensor at a time.
            let lazily = config.lora.is_some();
            let model = crate::run::weights::load_base_weights(model, &path, lazily)
                .with_context(|| format!("weights {} do not fit", path.display()))?;
            (model, sum)
        }
    };
    let run = source
        .dir
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", source.dir.display()))?;
    let base = LoraBase {
        run,
        weights_sha256,
    };
    Ok((model, base))
}

/// A new run for `options`, with its tokenizer trained and its corpus split (its directory is
/// not created yet).
fn new_run(options: &TrainOptions) -> Result<(RunDir, Dataset)> {
    let source = options
        .config
        .clone()
        .unwrap_or(ConfigSource::Preset("default"));
    // A fine-tune's architecture is its base's: the config's own [model] is never read, so
    // `--set model.KEY` is checked against the base (`init_source`), not the config.
    let overrides: Vec<String> = match options.init_from {
        Some(_) => (options.overrides.iter())
            .filter(|o| !architecture_key(o))
            .cloned()
            .collect(),
        None => options.overrides.clone(),
    };
    let mut config = source.load(&overrides)?;
    let out = options
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(source.name()));
    // Before the corpus is prepared: that can take a while.
    checkpoint::refuse_existing(&out)?;
    let init = match &options.init_from {
        Some(dir) => Some(Box::new(init_source(dir, &mut config, &options.overrides)?)),
        None if config.lora.is_some() => bail!(
            "LoRA trains adapters on a pretrained model: give the run to fine-tune with \
             --init-from RUN (an imported model, or a run of your own)"
        ),
        None => None,
    };
    let given = init.as_ref().map(|run| &run.tokenizer);
    let corpus = corpus::for_new_run(&mut config, &out, given)?;
    let dir = RunDir::New {
        out,
        config,
        tokenizer: corpus.tokenizer,
        prepared: corpus.prepared,
        init,
    };
    Ok((dir, corpus.data))
}

/// The run `dir` that a fine-tuning run starts from; `config` takes its architecture (all but
/// `model.dropout`, and a shorter `model.block_size` asked for) and tokenizer kind. A `--set
/// model.KEY` among `overrides` that would change that architecture otherwise is refused by
/// name, not dropped.
fn init_source(dir: &std::path::Path, config: &mut RunConfig, overrides: &[String]) -> Result<Run> {
    let source = Run::open(dir).context("--init-from")?;
    if !source.has_checkpoint() {
        bail!(
            "--init-from {}: the run has no checkpoint yet",
            dir.display()
        );
    }
    let context = keeps_architecture(&source.config, overrides)
        .with_context(|| format!("--init-from {}", dir.display()))?;
    let dropout = config.model.dropout;
    config.model = source.config.model.clone();
    config.model.dropout = dropout;
    // A shorter context: a learned position table is cropped to it as the base is read.
    config.model.block_size = context.unwrap_or(config.model.block_size);
    // The model was taught its source's chat format, unless this config gives another.
    if config.chat.is_default() {
        config.chat = source.config.chat.clone();
    }
    config.data.tokenizer = source.tokenizer.kind_setting();
    config.validate()?;
    if config.lora.is_some() && source.config.lora.is_some() {
        bail!(
            "--init-from {}: a LoRA run cannot be the base of another LoRA run; fine-tune it \
             in full (drop --lora), or export it merged and import that",
            dir.display()
        );
    }
    Ok(source)
}

/// Refuses a `--set model.KEY` (`model.dropout` aside) that gives the fine-tune another value
/// than its base `source` has: the weights are the base's, and so is their shape. A shorter
/// context is the one change allowed (`model.block_size` at most the base's): it is returned.
fn keeps_architecture(source: &RunConfig, overrides: &[String]) -> Result<Option<usize>> {
    let base = source.to_toml();
    let mut context = None;
    for assignment in overrides.iter().filter(|o| architecture_key(o)) {
        let key = assignment.split_once('=').map_or("", |(key, _)| key.trim());
        let mut changed = RunConfig::load_str(&base, std::slice::from_ref(assignment))?.model;
        let (block, most) = (changed.block_size, source.model.block_size);
        if key == "model.block_size" {
            if block > most {
                bail!(
                    "`--set {assignment}`: a fine-tune's context can be shorter than its base's \
                     ({most} tokens), not longer"
                );
            }
            context = Some(block);
            changed.block_size = most;
        }
        if changed != source.model {
            let field = &key["model.".len()..];
            let table: toml::Table = toml::from_str(&base)?;
            let was = table
                .get("model")
                .and_then(|model| model.get(field))
                .map_or_else(|| "unset".to_string(), ToString::to_string);
            bail!(
                "a fine-tune keeps its base's architecture, and `--set {assignment}` would \
                 change it ({key} is {was} there); of [model], only dropout and a shorter \
                 block_size can differ"
            );
        }
    }
    Ok(context)
}

/// Whether `assignment` (`--set section.key=value`) names a part of the architecture: a
/// `model.` key other than dropout and `kernel` (an older name of `train.attention_kernel`).
fn architecture_key(assignment: &str) -> bool {
    let key = assignment
        .split_once('=')
        .map_or(assignment, |(key, _)| key)
        .trim();
    key.starts_with("model.") && !matches!(key, "model.dropout" | "model.kernel")
}

/// The run in `options.out`, with the allowed overrides applied, and its corpus split.
fn resume_run(options: &TrainOptions) -> Result<(Run, Dataset)> {
    let Some(out) = &options.out else {
        bail!("--resume needs --out DIR, the run directory to continue");
    };
    if options.config.is_some() {
        bail!("--resume continues with the run's own config.toml; drop --config");
    }
    if options.init_from.is_some() {
        bail!("--resume continues the run's own weights; drop --init-from");
    }
    for o in &options.overrides {
        let key = o.split('=').next().unwrap_or_default().trim();
        if !CHANGEABLE_ON_RESUME.contains(&key) {
            bail!(
                "--resume cannot change `{key}` (only {})",
                CHANGEABLE_ON_RESUME.join(", ")
            );
        }
    }
    let mut run = Run::open_to_write(out)?;
    if !options.overrides.is_empty() {
        run.config = RunConfig::load_str(&run.config.to_toml(), &options.overrides)?;
        run.write_config()?;
    }
    let data = corpus::for_run(&run.dir, &run.config, &run.tokenizer, true)?;
    Ok((run, data))
}

/// The memory a run of `config` with a vocabulary of `vocab_size` needs on the `kind` of
/// engine where `placement` trains it; where the device can say what is free (the CPU, CUDA),
/// a run that cannot fit is refused before anything is allocated or written.
fn memory_check(
    config: &RunConfig,
    vocab_size: usize,
    kind: EngineKind,
    placement: &Placement,
) -> Result<memory::Estimate> {
    let estimate = memory::Estimate::training(config, vocab_size, kind);
    let memory = match placement.on_host() {
        true => "memory",
        false => "GPU memory",
    };
    estimate.check_fits(placement.available_memory(), memory)?;
    Ok(estimate)
}

/// A new model, initialised on the CPU from the seed and then moved: the same seed gives the
/// same starting weights on every backend.
fn initial_model(config: &RunConfig, vocab_size: usize, device: &Device) -> Result<Gpt> {
    let cpu = Device::flex();
    let gpt = config.gpt(vocab_size);
    let mut model = gpt.init_with_attention(device, config.train.attention_kernel)?;
    {
        // Burn draws the weights at their first use: here, when they are copied.
        let _streams = tinygpt_model::seeded(&cpu, mix(config.train.seed, 0, INIT_STREAM));
        let init = gpt.init(&cpu)?;
        crate::run::weights::copy_weights(&init, &mut model)?;
    }
    Ok(model)
}

/// The `last` checkpoint's model (with the parameter ids its optimizer state is keyed by), its
/// AdamW and the training state.
fn saved_model(run: &Run, device: &Device) -> Result<(Gpt, ModuleOptimizer, TrainState)> {
    let mut checkpoint = run.checkpoint(Which::Last, true)?;
    if checkpoint.warning.is_some() {
        run.set_aside_damaged_last()?;
    }
    let model = run.model_from(&mut checkpoint, device)?;
    let model = crate::run::weights::restore_param_ids(model, &checkpoint.state.param_ids)?;
    let path = checkpoint.dir.join(checkpoint::OPTIMIZER);
    // An imported model has weights and no training to continue.
    let bytes = checkpoint.optimizer.with_context(|| {
        format!(
            "{} is missing: the run has no training state to continue (an imported model has \
             none); fine-tune it into a new run with --init-from {} --out NEW",
            path.display(),
            run.dir.display()
        )
    })?;
    let optim = load_optimizer(&run.config, &model, bytes)
        .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))?;
    Ok((model, optim, checkpoint.state))
}
