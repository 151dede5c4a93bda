//! A training run as named steps: [`Trainer::step`], [`Trainer::settle`],
//! [`Trainer::evaluate`] and [`Trainer::checkpoint`] (set-up is [`Trainer::open`], in
//! `setup.rs`; what it prints is in `report.rs`); [`Trainer::run`] is nanoGPT's loop over them.
//!
//! AdamW (decay on 2-D weights only), or Muon for the blocks' matrices beside it, linear warmup
//! then cosine decay to `min_lr`, gradient accumulation, clipping by the global gradient norm, periodic train/val loss estimates, best
//! and last checkpoints. Every random draw (initial weights, batches, dropout) is derived from
//! the seed and the step, so a run is reproducible and a resumed run continues exactly.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use burn::tensor::Device;

use super::engine::{Engine, Step};
use super::memory::{self, human};
use super::optim::learning_rate;
use super::report::Clock;
use super::snapshot::Snapshot;
use crate::backend::describe;
use crate::config::{RunConfig, TrainDType};
use crate::data::{Batch, Dataset, mix, step_rng};
use crate::progress::Progress;
use crate::run::checkpoint::{OptimizerFile, Run, TrainState, Which};
use crate::run::journal::{Journal, StepLine};
use crate::run::metrics::{Metrics, Row};

/// RNG streams: batches of micro-step `k` use stream `k`; these are far above any `grad_accum`.
const EVAL_STREAM: u64 = 1 << 20;
const DROPOUT_STREAM: u64 = 1 << 21;
/// f16 steps skipped in a row for loss-scale overflows before the run counts as diverged: the
/// scale has then fallen by 2^32 from where it overflowed.
const OVERFLOW_LIMIT: usize = 32;

/// When [`Trainer::run`] stops early: Ctrl-C, a time limit, or a target loss.
pub struct Limits<'a> {
    pub stop: &'a AtomicBool,
    pub max_time: Option<Duration>,
    /// Stop at the first evaluation whose loss over the whole validation split is at most
    /// this (time to a good model, as modded-nanogpt's speedrun measures it).
    pub to_loss: Option<f64>,
}

/// How a training run ended.
pub struct Outcome {
    pub dir: PathBuf,
    pub interrupted: bool,
    /// Whether the run has a checkpoint to sample from (none when it trained no step:
    /// `--max-iters 0`).
    pub checkpointed: bool,
}

/// A loss estimate of both splits.
#[derive(Debug, Clone, Copy)]
pub struct Estimate {
    pub train_loss: f64,
    pub val_loss: f64,
    /// The standard error of `val_loss`, from the spread of its batches' losses; `None` from
    /// fewer than [`MIN_BATCHES_FOR_ERROR`] batches, too few to say, and for the whole split.
    pub val_error: Option<f64>,
    /// `val_loss` is the loss over the whole validation split, not an estimate.
    pub whole_split: bool,
    /// The best validation loss so far.
    pub improved: bool,
}

/// Batches an estimate needs before its spread is taken as its standard error: from fewer, the
/// sample deviation is too often far below the true one.
const MIN_BATCHES_FOR_ERROR: usize = 10;

/// A run being trained: its directory, data, engine (weights and optimizer) and state.
pub struct Trainer {
    pub(super) run: Run,
    pub(super) config: RunConfig,
    pub(super) data: Dataset,
    pub(super) engine: Box<dyn Engine>,
    pub(super) state: TrainState,
    pub(super) metrics: Metrics,
    /// `steps.csv` and `evals.jsonl`.
    pub(super) journal: Journal,
    /// The prompt each evaluation samples from and maps the attention of.
    pub(super) sample_prompt: Vec<u32>,
    pub(super) device: Device,
    /// The device's backend as the log names it (`flex`, `ndarray`, `wgpu`, `cuda`).
    pub(super) device_name: &'static str,
    /// Why `auto` passed over a GPU or the fused engine, when it did.
    pub(super) notes: Vec<String>,
    /// What the run was estimated to need.
    pub(super) memory: memory::Estimate,
    /// Steps skipped in a row, up to the latest settled.
    pub(super) skipped_in_a_row: usize,
    /// Steps whose outcome [`Trainer::settle`] has accounted.
    pub(super) settled: usize,
    pub(super) resumed: bool,
    /// The weights are a new initialisation: neither resumed nor from `--init-from`.
    pub(super) new_weights: bool,
    /// The ranks this process (rank 0) trains the run with, when there are several.
    pub(super) ranks: Option<crate::distributed::Ranks>,
    /// A checkpoint was written since the ranks last compared their weights.
    pub(super) checkpointed: bool,
    /// Another rank was signalled to stop (Ctrl-C): the run stops as for this one's.
    pub(super) stop_asked: bool,
}

impl Trainer {
    /// The start line: model, device, engine, corpus, run directory; then the engine and its
    /// backend in a fixed form, `engine: KIND on BACKEND` (see [`EngineKind::name`]), and
    /// notes.
    ///
    /// [`EngineKind::name`]: crate::backend::EngineKind::name
    pub fn describe(&mut self) -> Result<String> {
        let (config, data) = (&self.config, &self.data);
        let m = &config.model;
        let model = self.engine.shapes()?;
        let (params, non_embedding) = (model.num_params(), model.num_params_non_embedding());
        let lora = match &config.lora {
            Some(lora) => format!("\nlora: {}", lora.describe(model.config())),
            None => String::new(),
        };
        Ok(format!(
            "training {} layers x {} heads, n_embd {}, block {} ({params} parameters, {:.2}M \
             without wpe) on {}, {} | memory ~{} | corpus {} ({} train / {} val tokens, {} \
             tokenizer, vocab {}) | run {}\nengine: {} on {}\nparts: {}{}{}",
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
            self.engine.kind().name(),
            self.device_name,
            m.parts(),
            lora,
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
    pub(crate) fn tokens_per_step(&self) -> u64 {
        let t = &self.config.train;
        (t.batch_size * self.config.model.block_size * t.grad_accum) as u64
    }

    /// One optimizer step at the current step's learning rate: `grad_accum` micro-batches,
    /// global-norm clipping, the optimizer's update (AdamW, or Muon beside it); a step with a
    /// non-finite loss or norm skips its update.
    /// What it saw is accounted by [`Trainer::settle`].
    pub fn step(&mut self) -> Result<()> {
        self.order(true)?;
        train_step(
            self.engine.as_mut(),
            &self.data,
            &self.config,
            self.state.step,
        )?;
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
            // In f16 a finite loss with non-finite gradients is the loss scale overflowing: it
            // halves and the step is skipped, as expected while it settles. Only when it has
            // halved OVERFLOW_LIMIT times in a row is it the run that diverged.
            let overflow = self.config.train.dtype == TrainDType::F16 && step.loss.is_finite();
            let limit = match overflow {
                true => self.config.train.nonfinite_limit.max(OVERFLOW_LIMIT),
                false => self.config.train.nonfinite_limit,
            };
            if self.skipped_in_a_row >= limit {
                return Err(self.diverged(step));
            }
            let why = match overflow {
                true => "f16 loss scale overflowed and halves",
                false => "not finite",
            };
            progress.say(format!(
                "step {}: loss {}, gradient norm {}: {why}, update skipped ({} in a row)",
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
    /// own (so evaluating never changes the training batches), or over the whole validation
    /// split where `whole_split`; recorded in the state and `metrics.csv`.
    pub fn evaluate(&mut self, elapsed_s: f64, whole_split: bool) -> Result<Estimate> {
        let step = self.state.step;
        let mut means = [0.0; 2];
        let mut val_error = None;
        if whole_split {
            means[1] = self.whole_val_loss()?;
        }
        let t = &self.config.train;
        let splits = [&self.data.train, &self.data.val];
        for (k, split) in splits
            .into_iter()
            .enumerate()
            .take(2 - whole_split as usize)
        {
            let mut rng = step_rng(t.seed, step, EVAL_STREAM + k as u64);
            let batches: Vec<Batch> = (0..t.eval_iters)
                .map(|_| self.data.sample(split, t.batch_size, &mut rng))
                .collect();
            let losses = self.engine.losses(&batches)?;
            means[k] = losses.iter().sum::<f64>() / t.eval_iters as f64;
            if k == 1 {
                val_error = standard_error(&losses);
            }
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
        // The best is among the weights this run saves: step 0's (the initial or source
        // weights) is not saved, so it is no candidate, or a run whose training only made the
        // loss worse would have no `best` weights at all.
        let saved = step > 0 || self.resumed;
        let improved = saved && state.best_val_loss.is_none_or(|best| val_loss < best);
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
        let mut snapshot = Snapshot {
            engine: &mut *self.engine,
            tokenizer: &self.run.tokenizer,
            device: &self.device,
            prompt: &self.sample_prompt,
            config: &self.config,
        };
        let line = snapshot.line(step, (train_loss, val_loss))?;
        self.journal.eval(&line)?;
        Ok(Estimate {
            train_loss,
            val_loss,
            val_error,
            whole_split,
            improved,
        })
    }

    /// Saves the `last` checkpoint (weights, optimizer state, training state), and `best` too when
    /// `best` is set.
    pub fn checkpoint(&mut self, best: bool) -> Result<()> {
        // Nothing learnt from damaged token files is kept.
        self.data.verification.finished()?;
        self.checkpointed = self.ranks.is_some();
        // Shares the fused engine's state rather than copying it; both borrow the engine.
        let saving = self.engine.saving()?;
        if best {
            self.run
                .save(Which::Best, saving.model, None, &self.state)?;
        }
        let optimizer = Some(OptimizerFile::Writer(saving.optimizer));
        self.run
            .save(Which::Last, saving.model, optimizer, &self.state)
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
            if evaluates_at(&self.config, step) && !self.unlearnt_above(limits.to_loss, &progress) {
                let estimate = self.evaluate_and_save(&mut clock, &progress, limits.to_loss)?;
                if let Some(target) = limits.to_loss
                    && self.reached(target, &estimate, &mut clock, &progress)?
                {
                    break;
                }
            }
            if step >= t.max_iters {
                break;
            }
            let over_time = limits
                .max_time
                .is_some_and(|m| clock.started.elapsed() >= m);
            let stopped = limits.stop.load(Ordering::SeqCst) || self.stop_asked;
            if stopped || over_time {
                // Ending on --max-time is ending as asked; only Ctrl-C is an interruption.
                interrupted = stopped;
                self.stop_and_save(&clock, &progress, !stopped)?;
                break;
            }
            self.step()?;
            self.data.verification.so_far()?;
            progress.at(self.state.step);
            // The loss is read at log intervals: on a GPU, only there does the host wait.
            let log =
                self.state.step.is_multiple_of(t.log_interval) || self.state.step == t.max_iters;
            if let Some(step) = self.settle(log, &progress)?
                && log
                && step.applied
            {
                let lr = learning_rate(&self.config, self.state.step - 1);
                let at = (self.state.step, t.max_iters);
                let tokens_per_s = clock.log(&progress, at, step.loss, lr, self.tokens_per_step());
                self.journal.step(&StepLine {
                    step: self.state.step,
                    loss: step.loss,
                    lr,
                    grad_norm: step.grad_norm,
                    tokens_per_s,
                    skipped: self.state.skipped_steps,
                    elapsed_s: clock.elapsed_s(),
                })?;
            }
        }
        self.order(false)?;
        progress.finish();
        let summary = clock.summary(&self.state, self.tokens_per_step(), &self.run.dir);
        println!("{summary}");
        Ok(Outcome {
            dir: self.run.dir.clone(),
            interrupted,
            checkpointed: self.run.has_checkpoint(),
        })
    }

    /// Over ranks: tells the others to take the next step (`go`) or that the run is over,
    /// every rank first comparing its weights with this one's when a checkpoint was written.
    fn order(&mut self, go: bool) -> Result<()> {
        let Some(ranks) = &self.ranks else {
            return Ok(());
        };
        let check = std::mem::take(&mut self.checkpointed);
        let at = self.state.step;
        // Rank 0's own Ctrl-C is `limits.stop`, read in the loop; the others' come back here.
        let stop = false;
        let order = super::ranks::Order {
            at,
            go,
            check,
            stop,
        }
        .exchange(ranks);
        self.stop_asked |= order.stop;
        if check {
            super::ranks::check_weights(ranks, self.engine.as_mut(), at)?;
        }
        Ok(())
    }

    /// Evaluates ([`Trainer::evaluate`]) and checkpoints. With `--to-loss`, the last step's
    /// validation loss is the whole split's, which the target needs there in any case.
    fn evaluate_and_save(
        &mut self,
        clock: &mut Clock,
        progress: &Progress,
        to_loss: Option<f64>,
    ) -> Result<Estimate> {
        self.settle(true, progress)?;
        let eval_start = Instant::now();
        let whole_split = to_loss.is_some() && self.state.step >= self.config.train.max_iters;
        let estimate = self.evaluate(clock.elapsed_s(), whole_split)?;
        progress.say(format!(
            "step {}: train loss {:.4}, val loss {:.4}{}{}",
            self.state.step,
            estimate.train_loss,
            estimate.val_loss,
            if whole_split { " (whole split)" } else { "" },
            if estimate.improved { " (best)" } else { "" }
        ));
        if self.state.step > 0 || self.resumed {
            self.checkpoint(estimate.improved)?;
        }
        clock.eval_time += eval_start.elapsed();
        // tokens/s in the progress line measures training only.
        clock.window = (Instant::now(), self.state.step);
        Ok(estimate)
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
}

/// Whether a run of `config` evaluates (and checkpoints) when it reaches `step`: every
/// `eval_interval` steps and at the end.
pub(crate) fn evaluates_at(config: &RunConfig, step: usize) -> bool {
    step.is_multiple_of(config.train.eval_interval) || step == config.train.max_iters
}

/// Training step `step` of a run of `config` on `data`: its batches (drawn from the seed and
/// the step), its dropout seed and learning rate, through `engine`.
pub fn train_step(
    engine: &mut dyn Engine,
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

/// The standard error of the mean of `losses` (each a batch's), from their sample deviation;
/// `None` from fewer than [`MIN_BATCHES_FOR_ERROR`].
fn standard_error(losses: &[f64]) -> Option<f64> {
    let n = losses.len();
    if n < MIN_BATCHES_FOR_ERROR {
        return None;
    }
    let mean = losses.iter().sum::<f64>() / n as f64;
    let variance = losses.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    Some((variance / n as f64).sqrt())
}
