//! `tinygpt bench`: training and sampling speed, and peak memory, per config and backend.
//!
//! Training runs the real training step (`train::train_step`: forward, backward, global-norm
//! clipping, AdamW) on random tokens; the figure is the median step after warm-up. Sampling
//! generates with the KV cache from a one-token prompt, by the backend's decoder (the fused CPU
//! decoder for `fused`, Burn's `Gpt::generate` otherwise). Peak memory is the process's peak
//! resident set (`VmHWM`), reset before each case where Linux allows it.

use std::time::Instant;

use anyhow::{Result, bail};
use burn::module::Module;
use rand::RngExt;
use serde::Serialize;
use tinygpt_model::{GenerateOptions, generate};

use crate::backend::{Backend, describe};
use crate::config::RunConfig;
use crate::data::{Dataset, Split, step_rng};
use crate::engine::{Engine, decoder};
use crate::train::{adamw_settings, learning_rate, optimizer, train_step};

/// The configs `bench` knows, by name: the files in `configs/`, built in.
pub const CONFIGS: [(&str, &str); 2] = [
    ("baby", include_str!("../../../configs/baby.toml")),
    (
        "shakespeare-char",
        include_str!("../../../configs/shakespeare-char.toml"),
    ),
];

/// One line of results.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub config: String,
    pub backend: String,
    pub device: String,
    pub params: usize,
    pub batch: usize,
    pub block: usize,
    pub iters: usize,
    pub ms_per_iter: f64,
    pub train_tokens_per_s: f64,
    pub sample_tokens: usize,
    pub sample_tokens_per_s: f64,
    pub peak_rss_mib: Option<f64>,
}

pub struct BenchArgs {
    pub configs: Vec<String>,
    pub backends: Vec<Backend>,
    pub iters: usize,
    pub warmup: usize,
    pub sample_tokens: usize,
}

pub fn bench(args: &BenchArgs, mut report: impl FnMut(&BenchResult)) -> Result<()> {
    for name in &args.configs {
        let Some((_, toml)) = CONFIGS.iter().find(|(n, _)| n == name) else {
            bail!(
                "unknown bench config `{name}` (known: {})",
                CONFIGS.map(|(n, _)| n).join(", ")
            );
        };
        let config = RunConfig::from_toml(toml)?;
        for &backend in &args.backends {
            report(&bench_one(name, &config, backend, args)?);
        }
    }
    Ok(())
}

fn bench_one(
    name: &str,
    config: &RunConfig,
    backend: Backend,
    args: &BenchArgs,
) -> Result<BenchResult> {
    const VOCAB: usize = 65;
    reset_peak_rss();
    let backend = backend.resolve();
    let device = backend.device()?;
    let train_device = device.clone().autodiff();
    // Random tokens: the speed of a step does not depend on the text.
    let mut rng = step_rng(config.train.seed, 0, 0);
    let stream: Vec<u32> = (0..100_000)
        .map(|_| rng.random_range(0..VOCAB as u32))
        .collect();
    let data = Dataset {
        train: Split::Packed(stream.clone()),
        val: Split::Packed(stream),
        block_size: config.model.block_size,
    };
    let mut model = config.gpt(VOCAB).init(&train_device)?;
    let params = model.num_params();
    let mut optim = optimizer(config, &model);
    let adamw = adamw_settings(config, &model);
    let mut engine = Engine::new(
        backend,
        true,
        &device,
        (&model, &optim),
        adamw,
        config.workers(),
    )?;
    let mut times = Vec::with_capacity(args.iters);
    for step in 0..args.warmup + args.iters {
        let start = Instant::now();
        let (next, _) = train_step(
            model,
            &mut optim,
            &mut engine,
            &data,
            config,
            step,
            learning_rate(config, step),
        )?;
        model = next;
        if step >= args.warmup {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let seconds = times[times.len() / 2];
    let t = &config.train;
    let tokens = (t.batch_size * config.model.block_size * t.grad_accum) as f64;

    let inference = engine.sync(model, &mut optim)?.valid();
    let options = GenerateOptions {
        max_new_tokens: args.sample_tokens,
        temperature: 0.8,
        top_k: None,
        ..GenerateOptions::default()
    };
    let mut decoder = decoder(backend, true, &inference)?;
    // One untimed call warms kernels and allocations up.
    let warm_up = GenerateOptions {
        max_new_tokens: 4,
        ..options.clone()
    };
    generate(&mut *decoder, &[0], &warm_up, |_| {})?;
    let start = Instant::now();
    let sampled = generate(&mut *decoder, &[0], &options, |_| {})?.len();
    let sample_seconds = start.elapsed().as_secs_f64();

    Ok(BenchResult {
        config: name.to_string(),
        backend: format!("{backend:?}").to_lowercase(),
        device: describe(&device),
        params,
        batch: t.batch_size * t.grad_accum,
        block: config.model.block_size,
        iters: args.iters,
        ms_per_iter: seconds * 1e3,
        train_tokens_per_s: tokens / seconds,
        sample_tokens: sampled,
        sample_tokens_per_s: sampled as f64 / sample_seconds,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// Prints a table header for [`row`].
pub fn header() -> String {
    format!(
        "{:<17} {:<8} {:>9} {:>12} {:>14} {:>16} {:>14}",
        "config", "backend", "params", "ms/iter", "train tok/s", "sample tok/s", "peak RSS MiB"
    )
}

pub fn row(r: &BenchResult) -> String {
    format!(
        "{:<17} {:<8} {:>9} {:>12.1} {:>14.0} {:>16.0} {:>14}",
        r.config,
        r.backend,
        r.params,
        r.ms_per_iter,
        r.train_tokens_per_s,
        r.sample_tokens_per_s,
        r.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}"))
    )
}

/// Peak resident set of this process in MiB (Linux).
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Resets the peak (Linux: writing 5 to clear_refs), so each case reports its own.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
