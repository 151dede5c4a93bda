//! `tinygpt train`: nanoGPT's training loop.
//!
//! AdamW (decay on 2-D weights only), linear warmup then cosine decay to `min_lr`, gradient
//! accumulation, clipping by the global gradient norm, periodic train/val loss estimates, best
//! and last checkpoints. Every random draw (initial weights, batches, dropout) is derived from
//! the seed and the step, so a run is reproducible and a resumed run continues exactly.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use burn::module::{Module, ParamGroup, ParamId};
use burn::optim::{AdamWConfig, ModuleOptimizer};
use burn::tensor::{Bytes, Device};
use indicatif::{ProgressBar, ProgressStyle};
use tinygpt_model::{AdamWSettings, Gpt};

use crate::backend::{Backend, describe};
use crate::checkpoint::{self, Run, TrainState, Which};
use crate::config::RunConfig;
use crate::data::{Batch, Dataset, mix, read_corpus, step_rng};
use crate::engine::Engine;
use crate::metrics::{Metrics, Row};
use crate::tokenizer::Tokenizer;

/// RNG streams: batches of micro-step `k` use stream `k`; these are far above any `grad_accum`.
const EVAL_STREAM: u64 = 1 << 20;
const DROPOUT_STREAM: u64 = 1 << 21;
const INIT_STREAM: u64 = 1 << 22;

/// What `tinygpt train` was asked to do (its command-line arguments).
#[derive(clap::Args)]
pub struct TrainArgs {
    /// Run configuration (TOML with [model], [data], [train]).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Training corpus, UTF-8 text (default: the config's data.path).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Run directory (default: runs/<config name>). Must not exist unless --resume.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Override a config key, e.g. --set train.learning_rate=3e-4 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    pub resume: bool,
    /// Train to this many steps (overrides train.max_iters).
    #[arg(long, value_name = "N")]
    pub max_iters: Option<usize>,
    /// Stop (saving a checkpoint) after this long, e.g. 90s, 10m, 1h.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_time: Option<Duration>,
    /// Seed of the initial weights, batches and dropout (overrides train.seed).
    #[arg(long)]
    pub seed: Option<u64>,
}

/// How a training run ended.
pub struct Outcome {
    pub dir: PathBuf,
    pub interrupted: bool,
}

/// The learning rate at `step`: linear warmup to `learning_rate`, then cosine decay to
/// `min_lr` at `lr_decay_iters`, then `min_lr` (nanoGPT's `get_lr`).
pub fn learning_rate(config: &RunConfig, step: usize) -> f64 {
    let t = &config.train;
    if step < t.warmup_iters {
        return t.learning_rate * (step + 1) as f64 / (t.warmup_iters + 1) as f64;
    }
    let decay = config.lr_decay_iters();
    if step >= decay {
        return t.min_lr;
    }
    let ratio = (step - t.warmup_iters) as f64 / (decay - t.warmup_iters).max(1) as f64;
    t.min_lr + 0.5 * (1.0 + (std::f64::consts::PI * ratio).cos()) * (t.learning_rate - t.min_lr)
}

pub fn train(args: TrainArgs, stop: Arc<AtomicBool>) -> Result<Outcome> {
    let mut overrides = args.set.clone();
    if let Some(data) = &args.data {
        overrides.push(format!(
            "data.path={}",
            toml_string(&data.display().to_string())
        ));
    }
    if let Some(n) = args.max_iters {
        overrides.push(format!("train.max_iters={n}"));
    }
    if let Some(seed) = args.seed {
        overrides.push(format!("train.seed={seed}"));
    }

    let backend = args.backend.resolve();
    let device = backend.device()?;
    let (run, data) = if args.resume {
        let Some(out) = &args.out else {
            bail!("--resume needs --out DIR, the run directory to continue");
        };
        if args.config.is_some() {
            bail!("--resume continues with the run's own config.toml; drop --config");
        }
        // Only these may change when resuming; anything else would make it another run.
        const CHANGEABLE: [&str; 4] = [
            "train.max_iters",
            "data.path",
            "train.eval_interval",
            "train.log_interval",
        ];
        for o in &overrides {
            let key = o.split('=').next().unwrap_or_default().trim();
            if !CHANGEABLE.contains(&key) {
                bail!(
                    "--resume cannot change `{key}` (only {})",
                    CHANGEABLE.join(", ")
                );
            }
        }
        let mut run = Run::open(out)?;
        if !overrides.is_empty() {
            run.config = RunConfig::load_str(&run.config.to_toml(), &overrides)?;
            run.write_config()?;
        }
        let text = read_corpus(&run.config.data.path)?;
        let data = Dataset::new(
            &text,
            &run.tokenizer,
            &run.config.data,
            run.config.model.block_size,
        )
        .with_context(|| format!("corpus {}", run.config.data.path.display()))?;
        (run, data)
    } else {
        let config = RunConfig::load(args.config.as_deref(), &overrides)?;
        let out = args
            .out
            .clone()
            .unwrap_or_else(|| default_out(args.config.as_deref()));
        let text = read_corpus(&config.data.path)?;
        let tokenizer = Tokenizer::train(config.data.tokenizer, &text, config.data.bpe_vocab_size)?;
        // Everything that can fail on the input fails before the run directory is created.
        let data = Dataset::new(&text, &tokenizer, &config.data, config.model.block_size)
            .with_context(|| format!("corpus {}", config.data.path.display()))?;
        (Run::create(&out, config, tokenizer)?, data)
    };
    let config = run.config.clone();
    let vocab_size = run.tokenizer.vocab_size();
    let gpt = config.gpt(vocab_size);
    let train_device = device.clone().autodiff();

    let (mut model, mut state, mut optim) = if args.resume {
        let (model, state) = run.load_model(Which::Last, &train_device)?;
        let model = checkpoint::restore_param_ids(model, &state.param_ids)?;
        let optim = optimizer(&config, &model)
            .from_bytes(Bytes::from_bytes_vec(run.optimizer_bytes()?))
            .map_err(|e| {
                anyhow::anyhow!("optimizer state in {} is corrupt: {e:?}", run.dir.display())
            })?;
        (model, state, optim)
    } else {
        // Initialised on the CPU from the seed, then copied: the same seed gives the same
        // starting weights on every backend.
        let cpu = Device::flex();
        cpu.seed(mix(config.train.seed, 0, INIT_STREAM));
        let init = gpt.init(&cpu)?;
        let mut model = gpt.init(&train_device)?;
        checkpoint::load_weights(&mut model, checkpoint::weights_bytes(&init)?)?;
        let optim = optimizer(&config, &model);
        (model, TrainState::default(), optim)
    };

    let t = &config.train;
    let threads = config.workers();
    let mut engine = Engine::new(
        backend,
        args.backend == Backend::Fused,
        &device,
        (&model, &optim),
        adamw_settings(&config, &model),
        threads,
    )?;
    let tokens_per_step = (t.batch_size * config.model.block_size * t.grad_accum) as u64;
    let mut metrics = Metrics::open(&run.dir)?;
    println!(
        "training {} ({} parameters, {:.2}M without wpe) on {}, {} | corpus {} ({} train / {} val tokens, {} tokenizer, vocab {}) | run {}",
        describe_model(&config),
        model.num_params(),
        model.num_params_non_embedding() as f64 / 1e6,
        describe(&device),
        engine.describe(threads),
        config.data.path.display(),
        data.train.len(),
        data.val.len(),
        run.tokenizer.kind(),
        vocab_size,
        run.dir.display(),
    );
    if args.resume {
        println!("resuming at step {} of {}", state.step, t.max_iters);
    }

    let progress = progress_bar(t.max_iters as u64, state.step as u64);
    let started = Instant::now();
    let elapsed_before = state.elapsed_s;
    let mut eval_time = Duration::ZERO;
    let mut last_loss = f64::NAN;
    let mut interrupted = false;
    let first_step = state.step;
    let mut window = (Instant::now(), state.step);
    loop {
        let step = state.step;
        if step % t.eval_interval == 0 || step == t.max_iters {
            let eval_start = Instant::now();
            model = engine.sync(model, &mut optim)?;
            let (train_loss, val_loss) =
                estimate_loss(&model.valid(), &mut engine, &data, &config, step)?;
            eval_time += eval_start.elapsed();
            // tokens/s in the progress line measures training only.
            window = (Instant::now(), state.step);
            state.train_loss = Some(train_loss);
            state.val_loss = Some(val_loss);
            state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            let improved = state.best_val_loss.is_none_or(|best| val_loss < best);
            if improved {
                state.best_val_loss = Some(val_loss);
                state.best_step = Some(step);
            }
            metrics.record(
                &run.dir,
                Row {
                    step,
                    train_loss,
                    val_loss,
                    lr: learning_rate(&config, step),
                    tokens: state.tokens,
                    elapsed_s: state.elapsed_s,
                },
            )?;
            say(
                &progress,
                format!(
                    "step {step}: train loss {train_loss:.4}, val loss {val_loss:.4}{}",
                    if improved { " (best)" } else { "" }
                ),
            );
            if step > 0 || args.resume {
                if improved {
                    run.save(Which::Best, &model, None, &state)?;
                }
                save_last(&run, &model, &optim, &state)?;
            }
        }
        if step >= t.max_iters {
            break;
        }
        let over_time = args
            .max_time
            .is_some_and(|limit| started.elapsed() >= limit);
        if stop.load(Ordering::SeqCst) || over_time {
            interrupted = true;
            state.elapsed_s = elapsed_before + started.elapsed().as_secs_f64();
            model = engine.sync(model, &mut optim)?;
            save_last(&run, &model, &optim, &state)?;
            say(
                &progress,
                format!(
                    "{} at step {step}: saved {} (continue with --resume --out {})",
                    if over_time {
                        "time limit reached"
                    } else {
                        "interrupted"
                    },
                    run.dir.join("last").display(),
                    run.dir.display()
                ),
            );
            break;
        }

        let lr = learning_rate(&config, step);
        let (next, loss) = train_step(model, &mut optim, &mut engine, &data, &config, step, lr)?;
        model = next;
        last_loss = loss;
        state.step += 1;
        state.tokens += tokens_per_step;

        progress.set_position(state.step as u64);
        let since = window.0.elapsed().as_secs_f64();
        let tok_s = (state.step - window.1) as f64 * tokens_per_step as f64 / since.max(1e-9);
        progress.set_message(format!("loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tok/s"));
        if progress.is_hidden() && state.step % t.log_interval == 0 {
            println!(
                "step {}/{} | loss {loss:.4} | lr {lr:.2e} | {tok_s:.0} tokens/s",
                state.step, t.max_iters
            );
        }
        if since > 5.0 {
            window = (Instant::now(), state.step);
        }
    }
    progress.finish_and_clear();

    let wall = started.elapsed();
    let train_time = (wall - eval_time).as_secs_f64();
    let steps = state.step - first_step;
    println!(
        "done: step {} | wall {:.1}s ({:.1}s training, {:.1}s eval) | {:.0} training tokens/s | \
         last loss {} | best val {} | {}",
        state.step,
        wall.as_secs_f64(),
        train_time,
        eval_time.as_secs_f64(),
        steps as f64 * tokens_per_step as f64 / train_time.max(1e-9),
        if last_loss.is_nan() {
            "-".into()
        } else {
            format!("{last_loss:.4}")
        },
        state.best_val_loss.map_or("-".into(), |v| format!(
            "{v:.4} (step {})",
            state.best_step.unwrap_or(0)
        )),
        run.dir.display()
    );
    Ok(Outcome {
        dir: run.dir.clone(),
        interrupted,
    })
}

/// One optimizer step: `grad_accum` micro-batches, global-norm clipping, AdamW. Returns the
/// updated model and the mean loss of the micro-batches.
pub(crate) fn train_step(
    model: Gpt,
    optim: &mut ModuleOptimizer,
    engine: &mut Engine,
    data: &Dataset,
    config: &RunConfig,
    step: usize,
    lr: f64,
) -> Result<(Gpt, f64)> {
    let t = &config.train;
    let batches: Vec<Batch> = (0..t.grad_accum)
        .map(|micro| {
            let mut rng = step_rng(t.seed, step, micro as u64);
            data.sample(&data.train, t.batch_size, &mut rng)
        })
        .collect();
    let dropout_seed = mix(t.seed, step, DROPOUT_STREAM);
    let (grads, loss) = engine.gradients(&model, &batches, dropout_seed, t.grad_clip)?;
    if !loss.is_finite() {
        bail!(
            "the loss became {loss} at step {step}: lower train.learning_rate or set train.grad_clip"
        );
    }
    Ok((engine.apply(model, optim, grads, lr), loss))
}

/// Mean loss over `eval_iters` random batches of each split, drawn from a stream of their own
/// (so evaluating never changes the training batches).
fn estimate_loss(
    model: &Gpt,
    engine: &mut Engine,
    data: &Dataset,
    config: &RunConfig,
    step: usize,
) -> Result<(f64, f64)> {
    let t = &config.train;
    let workers = config.workers();
    let mut means = [0.0; 2];
    for (k, split) in [&data.train, &data.val].into_iter().enumerate() {
        let mut rng = step_rng(t.seed, step, EVAL_STREAM + k as u64);
        let batches: Vec<Batch> = (0..t.eval_iters)
            .map(|_| data.sample(split, t.batch_size, &mut rng))
            .collect();
        let losses = engine.losses(model, &batches, workers)?;
        means[k] = losses.iter().sum::<f64>() / t.eval_iters as f64;
    }
    Ok((means[0], means[1]))
}

/// The settings of [`optimizer`], for the fused engine's AdamW.
pub(crate) fn adamw_settings(config: &RunConfig, model: &Gpt) -> AdamWSettings {
    let t = &config.train;
    AdamWSettings {
        beta_1: t.beta1 as f32,
        beta_2: t.beta2 as f32,
        epsilon: ADAMW_EPSILON,
        weight_decay: t.weight_decay as f32,
        decayed: model.decayed_param_ids(),
    }
}

/// nanoGPT's (PyTorch's) AdamW epsilon; Burn's default is 1e-5.
const ADAMW_EPSILON: f32 = 1e-8;

/// AdamW with nanoGPT's two groups: weight decay on 2-D weights, none on biases and gains
/// ([`adamw_settings`], in Burn's optimizer).
pub(crate) fn optimizer(config: &RunConfig, model: &Gpt) -> ModuleOptimizer {
    let s = adamw_settings(config, model);
    let adamw = |weight_decay: f32| {
        AdamWConfig::new()
            .with_beta_1(s.beta_1)
            .with_beta_2(s.beta_2)
            .with_epsilon(s.epsilon)
            .with_weight_decay(weight_decay)
    };
    let undecayed: Vec<ParamId> = checkpoint::param_ids(model)
        .into_iter()
        .map(ParamId::from)
        .filter(|id| !s.decayed.contains(id))
        .collect();
    adamw(s.weight_decay).init().with_group(
        ParamGroup::from_ids(undecayed),
        adamw(0.0).build(),
        None,
    )
}

/// A progress bar on a terminal; hidden (plain log lines instead) otherwise.
fn progress_bar(len: u64, position: u64) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_position(position);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30.cyan/blue} step {pos}/{len} | {msg} | {elapsed_precise} < {eta_precise}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar
}

/// `runs/<config name>`, or `runs/default`.
fn default_out(config: Option<&std::path::Path>) -> PathBuf {
    let name = config
        .and_then(|p| p.file_stem())
        .map_or("default".into(), |s| s.to_string_lossy().into_owned());
    PathBuf::from("runs").join(name)
}

fn describe_model(config: &RunConfig) -> String {
    let m = &config.model;
    format!(
        "{} layers x {} heads, n_embd {}, block {}",
        m.n_layer, m.n_head, m.n_embd, m.block_size
    )
}

/// `text` as a TOML string literal, for `--set` overrides built from paths.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// The `last` checkpoint: weights, AdamW state and training state.
fn save_last(run: &Run, model: &Gpt, optim: &ModuleOptimizer, state: &TrainState) -> Result<()> {
    let optimizer = optim
        .into_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
    run.save(Which::Last, model, Some(&optimizer), state)
}

/// A line for the user: above the progress bar on a terminal, plain stdout otherwise (a hidden
/// bar swallows `println`).
fn say(progress: &ProgressBar, line: String) {
    if progress.is_hidden() {
        println!("{line}");
    } else {
        progress.println(line);
    }
}
