//! A training run as named steps: set-up ([`Trainer::open`]), [`Trainer::step`],
//! [`Trainer::evaluate`], [`Trainer::checkpoint`] and [`Trainer::report`]; [`Trainer::run`] is
//! nanoGPT's loop over them.
//!
//! AdamW (decay on 2-D weights only), linear warmup then cosine decay to `min_lr`, gradient
//! accumulation, clipping by the global gradient norm, periodic train/val loss estimates, best
//! and last checkpoints. Every random draw (initial weights, batches, dropout) is derived from
//! the seed and the step, so a run is reproducible and a resumed run continues exactly.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use tinygpt_model::Gpt;

use crate::backend::{Backend, Placement, describe};
use crate::checkpoint::{self, Run, TrainState, Which};
use crate::config::RunConfig;
use crate::corpus;
use crate::data::{Batch, Dataset, mix, step_rng};
use crate::engine::{Engine, Step};
use crate::memory::{self, human};
use crate::metrics::{Metrics, Row};
use crate::optim::{adamw_settings, learning_rate, load_optimizer, optimizer};
use crate::presets::ConfigSource;
use crate::progress::Progress;
use crate::tokenizer::Tokenizer;

/// RNG streams: batches of micro-step `k` use stream `k`; these are far above any `grad_accum`.
const EVAL_STREAM: u64 = 1 << 20;
const DROPOUT_STREAM: u64 = 1 << 21;
const INIT_STREAM: u64 = 1 << 22;

/// Only these may change when resuming; anything else would make it another run.
const CHANGEABLE_ON_RESUME: [&str; 5] = [
    "train.max_iters",
    "data.path",
    "train.eval_interval",
    "train.log_interval",
    "train.nonfinite_limit",
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
    /// (`model.dropout` stays this config's) and a fresh optimizer.
    pub init_from: Option<PathBuf>,
}

/// When [`Trainer::run`] stops early: Ctrl-C, or a time limit.
pub struct Limits<'a> {
    pub stop: &'a AtomicBool,
    pub max_time: Option<Duration>,
}

/// How a training run ended.
pub struct Outcome {
    pub dir: PathBuf,
    pub interrupted: bool,
}

/// A loss estimate of both splits.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    pub train_loss: f64,
    pub val_loss: f64,
    /// The best validation loss so far.
    pub improved: bool,
}

/// A run being trained: its directory, data, engine (weights and optimizer) and state.
pub struct Trainer {
    run: Run,
    config: RunConfig,
    data: Dataset,
    engine: Engine,
    state: TrainState,
    metrics: Metrics,
    device: Device,
    /// Why `auto` passed over a GPU or the fused engine, when it did.
    notes: Vec<String>,
    /// What the run was estimated to need.
    memory: memory::Estimate,
    /// Steps skipped in a row, up to the latest settled.
    skipped_in_a_row: usize,
    /// Steps whose outcome [`Trainer::settle`] has accounted.
    settled: usize,
    resumed: bool,
}

impl Trainer {
    /// Set-up: config, corpus, tokenizer, model, optimizer, engine, and last the run directory:
    /// everything that can fail fails before a new run directory is created.
    pub fn open(options: &TrainOptions) -> Result<Self> {
        let placement = options.backend.placement()?;
        let (dir, data) = if options.resume {
            let (run, data) = resume_run(options)?;
            (RunDir::Existing(run), data)
        } else {
            new_run(options)?
        };
        let memory = memory_check(&dir, &placement)?;
        let train_device = placement.device.clone().autodiff();
        let (model, optim, state) = match &dir {
            RunDir::Existing(run) if run.has_checkpoint() => saved_model(run, &train_device)?,
            // Stopped before its first checkpoint: its start is the seeded initialisation.
            RunDir::New {
                config,
                tokenizer,
                init: Some(source),
                ..
            } => {
                let vocab_size = tokenizer.vocab_size();
                let (mut model, optim) = initial_model(config, vocab_size, &train_device)?;
                let (weights, _) = source.load_model(Which::Best, &Device::flex())?;
                checkpoint::copy_weights(&weights, &mut model)?;
                (model, optim, TrainState::default())
            }
            RunDir::Existing(Run {
                config, tokenizer, ..
            })
            | RunDir::New {
                config, tokenizer, ..
            } => {
                let vocab_size = tokenizer.vocab_size();
                let (model, optim) = initial_model(config, vocab_size, &train_device)?;
                (model, optim, TrainState::default())
            }
        };
        let config = match &dir {
            RunDir::Existing(run) => run.config.clone(),
            RunDir::New { config, .. } => config.clone(),
        };
        let adamw = adamw_settings(&config, &model);
        let (engine, engine_note) = Engine::new(&placement, model, optim, adamw, config.workers())?;
        let notes = placement
            .note
            .clone()
            .into_iter()
            .chain(engine_note)
            .collect();
        let run = match dir {
            RunDir::Existing(run) => run,
            RunDir::New {
                out,
                config,
                tokenizer,
                prepared,
                ..
            } => Run::create(&out, config, tokenizer, |run| match prepared {
                Some(prepared) => corpus::replace_dir(prepared, &run.dir.join(corpus::RUN_DATA)),
                None => Ok(()),
            })?,
        };
        let metrics = Metrics::open(&run.dir)?;
        let settled = state.step;
        Ok(Self {
            run,
            config,
            data,
            engine,
            state,
            metrics,
            device: placement.device,
            notes,
            memory,
            skipped_in_a_row: 0,
            settled,
            resumed: options.resume,
        })
    }

    /// The start line: model, device, engine, corpus, run directory.
    pub fn describe(&mut self) -> Result<String> {
        let (config, data) = (&self.config, &self.data);
        let m = &config.model;
        let model = self.engine.model()?;
        let (params, non_embedding) = (model.num_params(), model.num_params_non_embedding());
        Ok(format!(
            "training {} layers x {} heads, n_embd {}, block {} ({params} parameters, {:.2}M \
             without wpe) on {}, {} | memory ~{} | corpus {} ({} train / {} val tokens, {} \
             tokenizer, vocab {}) | run {}{}",
            m.n_layer,
            m.n_head,
            m.n_embd,
            m.block_size,
            non_embedding as f64 / 1e6,
            describe(&self.device),
            self.engine.describe(),
            human(self.memory.total()),
            config.data.path.display(),
            data.train.len(),
            data.val.len(),
            self.run.tokenizer.kind(),
            self.run.tokenizer.vocab_size(),
            self.run.dir.display(),
            self.notes
                .iter()
                .map(|n| format!("\nnote: {n}"))
                .collect::<String>(),
        ))
    }

    /// The run's directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.run.dir
    }

    /// Where training stands.
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// Tokens one optimizer step consumes.
    pub fn tokens_per_step(&self) -> u64 {
        let t = &self.config.train;
        (t.batch_size * self.config.model.block_size * t.grad_accum) as u64
    }

    /// One optimizer step at the current step's learning rate: `grad_accum` micro-batches,
    /// global-norm clipping, AdamW; a step with a non-finite loss or norm skips its update.
    /// What it saw is accounted by [`Trainer::settle`].
    pub fn step(&mut self) -> Result<()> {
        train_step(&mut self.engine, &self.data, &self.config, self.state.step)?;
        self.state.step += 1;
        self.state.tokens += self.tokens_per_step();
        Ok(())
    }

    /// Accounts what the steps taken so far saw, in order, and returns the latest: skipped
    /// steps are counted and said on `progress`, and after `train.nonfinite_limit` of them in a
    /// row it is an error naming the step that reached it. On the CPU every outcome is known at
    /// once; on a GPU only `wait` reads them (one transfer, which waits for the device).
    pub fn settle(&mut self, wait: bool, progress: &Progress) -> Result<Option<Step>> {
        let outcomes = self.engine.outcomes(wait)?;
        let latest = outcomes.last().copied();
        for step in outcomes {
            self.settled += 1;
            if step.applied {
                self.skipped_in_a_row = 0;
                continue;
            }
            self.state.skipped_steps += 1;
            self.skipped_in_a_row += 1;
            if self.skipped_in_a_row >= self.config.train.nonfinite_limit {
                return Err(self.diverged(step));
            }
            progress.say(format!(
                "step {}: loss {}, gradient norm {}: not finite, update skipped ({} in a row)",
                self.settled, step.loss, step.grad_norm, self.skipped_in_a_row
            ));
        }
        Ok(latest)
    }

    /// The error that stops a run whose steps were skipped `nonfinite_limit` times in a row,
    /// the latest being `step`.
    fn diverged(&self, step: Step) -> anyhow::Error {
        let kept = self.run.checkpoint(Which::Last, false).map_or_else(
            |_| "no checkpoint was saved yet".to_string(),
            |c| {
                format!(
                    "the last checkpoint ({}, step {}) is kept",
                    c.dir.display(),
                    c.state.step
                )
            },
        );
        anyhow::anyhow!(
            "training stopped at step {}: {} steps in a row had a non-finite loss or gradient \
             norm (loss {}, norm {}); {kept}. Lower train.learning_rate or set train.grad_clip",
            self.settled,
            self.config.train.nonfinite_limit,
            step.loss,
            step.grad_norm
        )
    }

    /// Mean loss over `eval_iters` random batches of each split, drawn from a stream of their
    /// own (so evaluating never changes the training batches); recorded in the state and
    /// `metrics.csv`.
    pub fn evaluate(&mut self, elapsed_s: f64) -> Result<Estimate> {
        let (t, step) = (&self.config.train, self.state.step);
        let mut means = [0.0; 2];
        for (k, split) in [&self.data.train, &self.data.val].into_iter().enumerate() {
            let mut rng = step_rng(t.seed, step, EVAL_STREAM + k as u64);
            let batches: Vec<Batch> = (0..t.eval_iters)
                .map(|_| self.data.sample(split, t.batch_size, &mut rng))
                .collect();
            let losses = self.engine.losses(&batches)?;
            means[k] = losses.iter().sum::<f64>() / t.eval_iters as f64;
        }
        let [train_loss, val_loss] = means;
        if !(train_loss.is_finite() && val_loss.is_finite()) {
            bail!(
                "the loss estimate at step {step} is not finite (train {train_loss}, val \
                 {val_loss}): training diverged and this state is not saved. Lower \
                 train.learning_rate or set train.grad_clip"
            );
        }
        let state = &mut self.state;
        state.train_loss = Some(train_loss);
        state.val_loss = Some(val_loss);
        state.elapsed_s = elapsed_s;
        let improved = state.best_val_loss.is_none_or(|best| val_loss < best);
        if improved {
            state.best_val_loss = Some(val_loss);
            state.best_step = Some(step);
        }
        let row = Row {
            step,
            train_loss,
            val_loss,
            lr: learning_rate(&self.config, step),
            tokens: state.tokens,
            elapsed_s,
            skipped: state.skipped_steps,
        };
        self.metrics.record(&self.run.dir, row)?;
        Ok(Estimate {
            train_loss,
            val_loss,
            improved,
        })
    }

    /// Saves the `last` checkpoint (weights, AdamW state, training state), and `best` too when
    /// `best` is set.
    pub fn checkpoint(&mut self, best: bool) -> Result<()> {
        let optimizer = self.engine.optimizer_bytes()?;
        let model = self.engine.model()?;
        if best {
            self.run.save(Which::Best, model, None, &self.state)?;
        }
        self.run
            .save(Which::Last, model, Some(&optimizer), &self.state)
    }

    /// Trains to `train.max_iters`, evaluating every `eval_interval` steps and at the end,
    /// checkpointing after each evaluation, until done or `limits` say stop (then the last
    /// checkpoint is saved).
    pub fn run(&mut self, limits: Limits<'_>) -> Result<Outcome> {
        let t = self.config.train.clone();
        if self.resumed {
            println!("resuming at step {} of {}", self.state.step, t.max_iters);
        }
        let progress = Progress::new(t.max_iters as u64, self.state.step as u64);
        let mut clock = Clock::new(self.state.elapsed_s, self.state.step);
        let mut interrupted = false;
        loop {
            let step = self.state.step;
            if step.is_multiple_of(t.eval_interval) || step == t.max_iters {
                self.evaluate_and_save(&mut clock, &progress)?;
            }
            if step >= t.max_iters {
                break;
            }
            let over_time = limits
                .max_time
                .is_some_and(|m| clock.started.elapsed() >= m);
            if limits.stop.load(Ordering::SeqCst) || over_time {
                interrupted = true;
                self.stop_and_save(&clock, &progress, over_time)?;
                break;
            }
            self.step()?;
            progress.at(self.state.step);
            // The loss is read at log intervals: on a GPU, only there does the host wait.
            let log =
                self.state.step.is_multiple_of(t.log_interval) || self.state.step == t.max_iters;
            if let Some(step) = self.settle(log, &progress)?
                && log
                && step.applied
            {
                self.log(step.loss, &mut clock, &progress);
            }
        }
        progress.finish();
        println!("{}", self.report(&clock));
        Ok(Outcome {
            dir: self.run.dir.clone(),
            interrupted,
        })
    }

    /// The summary line at the end of a run.
    pub fn report(&self, clock: &Clock) -> String {
        let wall = clock.started.elapsed();
        let train_time = (wall - clock.eval_time).as_secs_f64();
        let steps = self.state.step - clock.first_step;
        let tokens_per_s = steps as f64 * self.tokens_per_step() as f64 / train_time.max(1e-9);
        let best = self.state.best_val_loss.map_or("-".into(), |v| {
            format!("{v:.4} (step {})", self.state.best_step.unwrap_or(0))
        });
        format!(
            "done: step {} | wall {:.1}s ({train_time:.1}s training, {:.1}s eval) | \
             {tokens_per_s:.0} training tokens/s | last loss {} | best val {best} | {}",
            self.state.step,
            wall.as_secs_f64(),
            clock.eval_time.as_secs_f64(),
            clock.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
            self.run.dir.display()
        )
    }

    fn evaluate_and_save(&mut self, clock: &mut Clock, progress: &Progress) -> Result<()> {
        self.settle(true, progress)?;
        let eval_start = Instant::now();
        let estimate = self.evaluate(clock.elapsed_s())?;
        progress.say(format!(
            "step {}: train loss {:.4}, val loss {:.4}{}",
            self.state.step,
            estimate.train_loss,
            estimate.val_loss,
            if estimate.improved { " (best)" } else { "" }
        ));
        if self.state.step > 0 || self.resumed {
            self.checkpoint(estimate.improved)?;
        }
        clock.eval_time += eval_start.elapsed();
        // tokens/s in the progress line measures training only.
        clock.window = (Instant::now(), self.state.step);
        Ok(())
    }

    fn stop_and_save(&mut self, clock: &Clock, progress: &Progress, over_time: bool) -> Result<()> {
        self.settle(true, progress)?;
        self.state.elapsed_s = clock.elapsed_s();
        self.checkpoint(false)?;
        let why = if over_time {
            "time limit reached"
        } else {
            "interrupted"
        };
        progress.say(format!(
            "{why} at step {}: saved {} (continue with --resume --out {})",
            self.state.step,
            self.run.dir.join("last").display(),
            self.run.dir.display()
        ));
        Ok(())
    }

    /// Reports a step's loss: the progress bar on a terminal, a log line otherwise.
    fn log(&mut self, loss: f64, clock: &mut Clock, progress: &Progress) {
        let step = self.state.step;
        clock.last_loss = Some(loss);
        let lr = learning_rate(&self.config, step - 1);
        let since = clock.window.0.elapsed().as_secs_f64();
        let tok_s =
            (step - clock.window.1) as f64 * self.tokens_per_step() as f64 / since.max(1e-9);
        let max_iters = self.config.train.max_iters;
        progress.update(
            &format!("loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tok/s"),
            || {
                format!(
                    "step {step}/{max_iters} | loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tokens/s"
                )
            },
        );
        if since > 5.0 {
            clock.window = (Instant::now(), step);
        }
    }
}

/// Training step `step` of a run of `config` on `data`: its batches (drawn from the seed and
/// the step), its dropout seed and learning rate, through `engine`.
pub fn train_step(
    engine: &mut Engine,
    data: &Dataset,
    config: &RunConfig,
    step: usize,
) -> Result<()> {
    let t = &config.train;
    let batches: Vec<Batch> = (0..t.grad_accum)
        .map(|micro| {
            let mut rng = step_rng(t.seed, step, micro as u64);
            data.sample(&data.train, t.batch_size, &mut rng)
        })
        .collect();
    let dropout_seed = mix(t.seed, step, DROPOUT_STREAM);
    let lr = learning_rate(config, step);
    engine.step(&batches, dropout_seed, t.grad_clip, lr)
}

/// The run's clocks: wall time, time spent evaluating, and the window tokens/s is measured over.
pub struct Clock {
    started: Instant,
    elapsed_before: f64,
    eval_time: Duration,
    window: (Instant, usize),
    first_step: usize,
    last_loss: Option<f64>,
}

impl Clock {
    fn new(elapsed_before: f64, step: usize) -> Self {
        Self {
            started: Instant::now(),
            elapsed_before,
            eval_time: Duration::ZERO,
            window: (Instant::now(), step),
            first_step: step,
            last_loss: None,
        }
    }

    /// Training wall time so far, earlier sessions of a resumed run included.
    fn elapsed_s(&self) -> f64 {
        self.elapsed_before + self.started.elapsed().as_secs_f64()
    }
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

/// A new run for `options`, with its tokenizer trained and its corpus split (its directory is
/// not created yet).
fn new_run(options: &TrainOptions) -> Result<(RunDir, Dataset)> {
    let source = options
        .config
        .clone()
        .unwrap_or(ConfigSource::Preset("default"));
    let mut config = source.load(&options.overrides)?;
    let out = options
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(source.name()));
    // Before the corpus is prepared: that can take a while.
    checkpoint::refuse_existing(&out)?;
    let init = match &options.init_from {
        Some(dir) => Some(Box::new(init_source(dir, &mut config)?)),
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
/// `model.dropout`) and tokenizer kind.
fn init_source(dir: &std::path::Path, config: &mut RunConfig) -> Result<Run> {
    let source = Run::open(dir).context("--init-from")?;
    if !source.has_checkpoint() {
        bail!(
            "--init-from {}: the run has no checkpoint yet",
            dir.display()
        );
    }
    let dropout = config.model.dropout;
    config.model = source.config.model.clone();
    config.model.dropout = dropout;
    config.data.tokenizer = source.tokenizer.kind_setting();
    config.validate()?;
    Ok(source)
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

/// The memory the run in `dir` needs where `placement` trains it; where the device can say what
/// is free (the CPU, CUDA), a run that cannot fit is refused before anything is allocated or
/// written.
fn memory_check(dir: &RunDir, placement: &Placement) -> Result<memory::Estimate> {
    let (config, tokenizer) = match dir {
        RunDir::Existing(run) => (&run.config, &run.tokenizer),
        RunDir::New {
            config, tokenizer, ..
        } => (config, tokenizer),
    };
    let vocab_size = tokenizer.vocab_size();
    let fused = placement.trains_fused(&config.gpt(vocab_size));
    let estimate = memory::Estimate::training(config, vocab_size, fused);
    let memory = match placement.on_host() {
        true => "memory",
        false => "GPU memory",
    };
    estimate.check_fits(placement.available_memory(), memory)?;
    Ok(estimate)
}

/// A new model, initialised on the CPU from the seed and then moved: the same seed gives the
/// same starting weights on every backend. And a fresh AdamW for it.
fn initial_model(
    config: &RunConfig,
    vocab_size: usize,
    device: &Device,
) -> Result<(Gpt, ModuleOptimizer)> {
    let cpu = Device::flex();
    cpu.seed(mix(config.train.seed, 0, INIT_STREAM));
    let gpt = config.gpt(vocab_size);
    let init = gpt.init(&cpu)?;
    let mut model = gpt.init(device)?;
    checkpoint::copy_weights(&init, &mut model)?;
    let optim = optimizer(config, &model);
    Ok((model, optim))
}

/// The `last` checkpoint's model (with the parameter ids its optimizer state is keyed by), its
/// AdamW and the training state.
fn saved_model(run: &Run, device: &Device) -> Result<(Gpt, ModuleOptimizer, TrainState)> {
    let checkpoint = run.checkpoint(Which::Last, true)?;
    if checkpoint.warning.is_some() {
        run.set_aside_damaged_last()?;
    }
    let model = run.model_from(&checkpoint, device)?;
    let model = checkpoint::restore_param_ids(model, &checkpoint.state.param_ids)?;
    let path = checkpoint.dir.join(checkpoint::OPTIMIZER);
    let bytes = checkpoint
        .optimizer
        .with_context(|| format!("{} is missing", path.display()))?;
    let optim = load_optimizer(&run.config, &model, bytes)
        .map_err(|e| anyhow::anyhow!("{} is damaged: {e}", path.display()))?;
    Ok((model, optim, checkpoint.state))
}
