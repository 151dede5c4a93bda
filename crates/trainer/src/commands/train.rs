//! `tinygpt train`: a new run from a config, or `--resume` of an existing one.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use tinygpt::backend::Backend;
use tinygpt::config::presets::ConfigSource;
use tinygpt::distributed::Ranks;
use tinygpt::train::{Limits, TrainOptions, Trainer};

/// Train a GPT on a text file; writes a run directory (weights, tokenizer, metrics, plot).
///
/// With no arguments: the `default` config on the built-in Paradise Lost, into runs/default.
/// Ctrl-C (or --max-time) saves the run; --resume continues it exactly.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt train\n  tinygpt train --config baby --data input.txt --out runs/baby\n  tinygpt train --config my.toml --set model.n_layer=2 --set data.tokenizer=bpe --max-time 5m\n  tinygpt train --resume --out runs/baby --max-iters 4000\n  tinygpt train --config finetune --init-from runs/imported --data milton.txt --out runs/milton\n  tinygpt train --config finetune --init-from runs/imported --lora 16 --data chats.jsonl --out runs/chat-lora\n  tinygpt train --config finetune --init-from runs/imported --lora 16 --weights q8_0 --data chats.jsonl --out runs/chat-qlora"
)]
pub struct Args {
    /// Run configuration: a built-in preset (default, baby, modern, speedrun, ten-minutes, shakespeare-char, finetune) or a TOML file
    /// with [model], [data], [train].
    #[arg(long, value_name = "NAME|FILE")]
    config: Option<String>,
    /// Training corpus: UTF-8 text (a file or folder), a directory `tinygpt prepare` wrote,
    /// or conversations to fine-tune on (a .jsonl file, or prepared from one) (default: the
    /// config's data.path).
    #[arg(long, value_name = "FILE")]
    data: Option<PathBuf>,
    /// Run directory (default: runs/<config name>). Must not exist unless --resume.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The device and engine (with --resume: the run's own unless given).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    backend: Backend,
    /// Override a config key, e.g. --set train.learning_rate=3e-4 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    resume: bool,
    /// Train to this many steps (overrides train.max_iters).
    #[arg(long, value_name = "N")]
    max_iters: Option<usize>,
    /// Stop (saving a checkpoint) after this long, e.g. 90s, 10m, 1h; the exit status is then
    /// 0, as for a finished run (Ctrl-C exits 130).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    max_time: Option<Duration>,
    /// Stop at the first evaluation (every train.eval_interval steps) where the loss over the
    /// whole validation split is at most this, and say how long training took to get there
    /// (evaluations not counted): time to a good model. New weights are not evaluated at step
    /// 0 when the target is far below a uniform guess's loss.
    #[arg(long, value_name = "LOSS")]
    to_loss: Option<f64>,
    /// Seed of the initial weights, batches and dropout (overrides train.seed).
    #[arg(long)]
    seed: Option<u64>,
    /// Fine-tune: start from this run's best weights (a run trained or imported by tinygpt),
    /// keeping its tokenizer and architecture; model.dropout and every [train] setting come
    /// from the config, and --set model.block_size may shorten the context (a learned
    /// position table is cropped). The optimizer starts fresh.
    #[arg(long, value_name = "RUN")]
    init_from: Option<PathBuf>,
    /// Fine-tune with LoRA (with --init-from): train adapters of this rank on every matrix of
    /// the blocks, the model itself frozen and held once; checkpoints hold the adapters alone
    /// (sets lora.rank; [lora] in the config sets alpha and targets).
    #[arg(long, value_name = "RANK")]
    lora: Option<usize>,
    /// With --lora: the frozen model's matrices as the run has them (f32), rounded to int8 in
    /// blocks of 32 (q8_0, QLoRA's idea), which the CPU's fused engine holds in about a quarter
    /// of the memory, or to four bits (q4_k: GGUF's Q4_K, Q5_0 where rows are not whole
    /// super-blocks of 256), about a seventh (sets lora.base).
    #[arg(long, value_name = "FORMAT", value_parser = ["f32", "q8_0", "q4_k"])]
    weights: Option<String>,
    /// With --lora: parts of the model trained in full beside the adapters (PEFT's
    /// modules_to_save), e.g. embedding,head when the new data has tokens the model never saw,
    /// such as a chat format's markers; checkpoints then hold them too (sets lora.also_train).
    #[arg(long, value_name = "PARTS", value_delimiter = ',', value_parser = ["embedding", "head"])]
    also_train: Vec<String>,
}

impl Args {
    /// The session's options (over `ranks`, when several): the flags that set config keys
    /// become overrides.
    fn options(&self, ranks: Option<Ranks>) -> TrainOptions {
        let mut overrides = self.set.clone();
        if let Some(data) = &self.data {
            let path = toml::Value::String(data.display().to_string());
            overrides.push(format!("data.path={path}"));
        }
        if let Some(n) = self.max_iters {
            overrides.push(format!("train.max_iters={n}"));
        }
        if let Some(seed) = self.seed {
            overrides.push(format!("train.seed={seed}"));
        }
        if let Some(rank) = self.lora {
            overrides.push(format!("lora.rank={rank}"));
        }
        if let Some(base) = &self.weights {
            overrides.push(format!("lora.base=\"{base}\""));
        }
        if !self.also_train.is_empty() {
            let parts: Vec<String> = self.also_train.iter().map(|p| format!("{p:?}")).collect();
            overrides.push(format!("lora.also_train=[{}]", parts.join(",")));
        }
        TrainOptions {
            config: self.config.as_deref().map(ConfigSource::parse),
            overrides,
            out: self.out.clone(),
            backend: self.backend,
            resume: self.resume,
            init_from: self.init_from.clone(),
            ranks,
        }
    }
}

/// Trains alone, or as one of `ranks`: rank 0 as alone (it writes the run), the others
/// following it. A rank that fails says so and ends the whole job, so that none is left
/// waiting for it.
pub fn run(args: Args, ranks: Option<Ranks>) -> Result<ExitCode> {
    // Every rank may be signalled (mpirun passes Ctrl-C on as SIGTERM); rank 0 hears of any
    // rank's at the next step and stops them all. Only the rank that writes says so.
    let follows = ranks.as_ref().is_some_and(|r| !r.leads());
    let stop = stop_on_signal(!follows)?;
    let Some(ranks) = ranks else {
        return lead(args, None, &stop);
    };
    let result = match ranks.leads() {
        true => lead(args, Some(ranks.clone()), &stop),
        false => {
            // Rank 0 resolves the run (its config, backend, weights) and hands it over.
            let stopped = tinygpt::train::follow(&ranks, &stop);
            stopped.map(|stopped| match stopped {
                true => ExitCode::from(130),
                false => ExitCode::SUCCESS,
            })
        }
    };
    if let Err(err) = &result {
        let err = format!("{err:#}").replace('\n', " ");
        let (rank, size, host) = (ranks.rank(), ranks.size(), ranks.host());
        eprintln!("tinygpt: error: rank {rank} of {size} (host {host}): {err}");
        ranks.abort(1);
    }
    result
}

/// A flag Ctrl-C (or SIGTERM) sets, saying so when `say`; a second one leaves at once.
fn stop_on_signal(say: bool) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || {
        if flag.swap(true, Ordering::SeqCst) {
            // Second Ctrl-C: leave now. Checkpoints are written atomically.
            std::process::exit(130);
        }
        if say {
            eprintln!("\ntinygpt: stopping after this step and saving (Ctrl-C again to quit now)");
        }
    })
    .context("cannot install the Ctrl-C handler")?;
    Ok(stop)
}

/// The run this process writes: alone, or as rank 0 of `ranks`.
fn lead(args: Args, ranks: Option<Ranks>, stop: &AtomicBool) -> Result<ExitCode> {
    if let Some(loss) = args.to_loss.filter(|l| !(l.is_finite() && *l > 0.0)) {
        anyhow::bail!("--to-loss must be a loss > 0, got {loss}");
    }
    let mut trainer = Trainer::open(&args.options(ranks))?;
    println!("{}", trainer.describe()?);
    let limits = Limits {
        stop,
        max_time: args.max_time,
        to_loss: args.to_loss,
    };
    let outcome = trainer.run(limits)?;
    if outcome.interrupted {
        return Ok(ExitCode::from(130));
    }
    match outcome.checkpointed {
        true => println!(
            "sample with: tinygpt generate --checkpoint {}",
            outcome.dir.display()
        ),
        false => println!("no checkpoint written: the run trained no step"),
    }
    Ok(ExitCode::SUCCESS)
}
