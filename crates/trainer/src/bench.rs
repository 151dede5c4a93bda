//! `tinygpt bench`: training and sampling speed, and peak memory, per config and backend.
//!
//! Training runs the real training step ([`train_step`]: forward, backward, global-norm
//! clipping, AdamW) on random tokens; the figure is the median step after warm-up. Sampling
//! generates with the KV cache from a one-token prompt, by the backend's decoder (the fused CPU
//! decoder for `fused`, Burn's `Gpt::generate` otherwise). Peak memory is the process's peak
//! resident set (`VmHWM`), reset before each case where Linux allows it.

use std::time::Instant;

use anyhow::Result;
use burn::module::Module;
use rand::RngExt;
use serde::Serialize;
use tinygpt_model::gpu::Kernels;
use tinygpt_model::{
    BatchDecoder, GenerateOptions, Gpt, decoding::Replay, decoding::weight_bytes_per_token,
    generate, generate_batch,
};

use crate::backend::{Backend, EngineKind, Placement, describe};
use crate::config::presets::ConfigSource;
use crate::config::{OptimizerKind, RunConfig, TrainDType, UpdateKind};
use crate::data::tokens::Tokens;
use crate::data::{Dataset, Split, step_rng};
use crate::decoder::{Weights, batch_decoder, decoder};
use crate::profile::{KernelProfile, profile, table};
use crate::token_cost::{self, TokenCost};
use crate::train::engine::{self, Engine};
use crate::train::optim::{Optimizer, optimizer};
use crate::train::session::train_step;

/// One line of results.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub config: String,
    pub backend: String,
    pub device: String,
    /// The widest vector instructions the CPU kernels take here (`avx512`, `avx2`,
    /// `baseline`): the CPU's, unless the build leaves AVX-512 out.
    pub cpu_instructions: String,
    pub params: usize,
    pub batch: usize,
    pub block: usize,
    pub iters: usize,
    /// `None` with `--iters 0` (sampling only), as `train_tokens_per_s`.
    pub ms_per_iter: Option<f64>,
    pub train_tokens_per_s: Option<f64>,
    /// The first training step, untimed in `ms_per_iter`: in a fresh process it includes
    /// compiling and tuning the step's kernels and planning their fusion (on a GPU backend).
    pub first_step_s: Option<f64>,
    pub sample_tokens: usize,
    /// Sequences sampled at once (`--streams`); `sample_tokens_per_s` counts them all.
    pub sample_streams: usize,
    /// On a GPU: whether the recorded sampling step (of all streams, with `--streams`) replayed
    /// as one device graph.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_graph: Option<bool>,
    /// Why it did not (the device's refusal, in its words).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample_graph_refused: Option<String>,
    pub sample_tokens_per_s: f64,
    /// The same generation's first pass, untimed in `sample_tokens_per_s`: on a GPU it
    /// includes compiling and tuning the kernels sampling needs.
    pub first_sample_tokens_per_s: f64,
    /// The prompt of `--prompt-tokens` (0: not timed), and how fast it was read.
    pub prompt_tokens: usize,
    pub prompt_tokens_per_s: Option<f64>,
    /// What a sampled token cost after warm-up, counted on a third pass (GPU backends only):
    /// kernels launched and compiled, host reads.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub sample_cost: Option<TokenCost>,
    /// Whether sampling used [`GenerateOptions::context_shift`].
    pub context_shift: bool,
    /// How sampling kept the matrices (`f32`, `q8_0`), and the bytes of them a token reads
    /// (the fused decoder's: `None` on Burn's backends).
    pub weights: String,
    pub weight_bytes_per_token: Option<usize>,
    pub peak_rss_mib: Option<f64>,
    /// `train.dtype`.
    pub dtype: String,
    /// The kernels a step launches (`--kernels`, on a GPU backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernels: Option<KernelProfile>,
}

/// What to measure.
pub struct BenchArgs {
    /// Configs by name or path.
    pub configs: Vec<String>,
    pub backends: Vec<Backend>,
    /// Timed training steps; 0 = none (sampling only).
    pub iters: usize,
    pub warmup: usize,
    pub sample_tokens: usize,
    /// A prompt of this many tokens to time reading (0: none).
    pub prompt_tokens: usize,
    /// Sample with the context shift instead of nanoGPT's exact sliding window.
    pub context_shift: bool,
    /// Sequences sampled at once through the batch decoder `serve` uses (1: the decoder of
    /// `generate`).
    pub streams: usize,
    /// How sampling keeps the matrices.
    pub weights: Weights,
    /// `section.key=value` overrides applied to every config (`train.dtype=bf16`).
    pub overrides: Vec<String>,
    /// Steps to profile the kernel launches of after the timed ones; 0 = none. GPU backends
    /// only.
    pub kernel_steps: usize,
}

/// Every config on every backend, each result reported as soon as it is measured.
pub fn bench(args: &BenchArgs, mut report: impl FnMut(&BenchResult)) -> Result<()> {
    for name in &args.configs {
        let config = ConfigSource::parse(name).load(&args.overrides)?;
        for &backend in &args.backends {
            report(&bench_one(name, &config, backend, args)?);
        }
    }
    Ok(())
}

/// The vocabulary of the random tokens: tiny shakespeare's.
pub const VOCAB: usize = 65;

fn bench_one(
    name: &str,
    config: &RunConfig,
    backend: Backend,
    args: &BenchArgs,
) -> Result<BenchResult> {
    reset_peak_rss();
    let placement = backend.placement()?;
    let on_gpu = match Kernels::for_device(&placement.device) {
        Kernels::Cube => true,
        Kernels::Burn => false,
    };
    refuse(name, config, backend, args, on_gpu)?;
    let data = random_tokens(config);
    let (mut engine, params) = open_engine(config, &placement)?;
    let (seconds, first_step_s) = median_step(engine.as_mut(), &data, config, args)?.unzip();
    let kernels = match args.kernel_steps {
        0 => None,
        // Sampling only: the kernels of sampled tokens.
        steps if args.iters == 0 => {
            Some(profile_sampling(engine.as_mut(), &placement, args, steps)?)
        }
        steps => Some(profile(steps, |i| {
            let step = args.warmup + args.iters + i;
            train_step(engine.as_mut(), &data, config, step)?;
            engine.outcomes(true).map(drop)
        })?),
    };
    let t = &config.train;
    let tokens = (t.batch_size * config.model.block_size * t.grad_accum) as f64;
    let sampled = sampling(engine.as_mut(), &placement, args, on_gpu)?;
    Ok(BenchResult {
        config: name.to_string(),
        backend: backend.name().to_string(),
        device: describe(&placement.device),
        params,
        batch: t.batch_size * t.grad_accum,
        block: config.model.block_size,
        iters: args.iters,
        ms_per_iter: seconds.map(|s| s * 1e3),
        train_tokens_per_s: seconds.map(|s| tokens / s),
        first_step_s,
        sample_tokens: sampled.tokens,
        sample_streams: args.streams,
        sample_graph: sampled.graph.as_ref().map(|r| *r == Replay::Graph),
        sample_graph_refused: match sampled.graph {
            Some(Replay::Rerun { why }) => Some(why),
            _ => None,
        },
        sample_tokens_per_s: sampled.tokens as f64 / sampled.seconds,
        first_sample_tokens_per_s: sampled.tokens as f64 / sampled.first_seconds,
        prompt_tokens: args.prompt_tokens,
        prompt_tokens_per_s: sampled
            .prompt_seconds
            .map(|s| args.prompt_tokens as f64 / s),
        sample_cost: sampled.cost,
        context_shift: args.context_shift,
        weights: args.weights.name().to_string(),
        weight_bytes_per_token: sampled.weight_bytes,
        peak_rss_mib: peak_rss_mib(),
        dtype: t.dtype.name().to_string(),
        cpu_instructions: tinygpt_model::instruction_set().name().to_string(),
        kernels,
    })
}

/// What `args` asks that `backend` or `config` cannot give, named.
fn refuse(
    name: &str,
    config: &RunConfig,
    backend: Backend,
    args: &BenchArgs,
    on_gpu: bool,
) -> Result<()> {
    if args.kernel_steps > 0 && !on_gpu {
        anyhow::bail!(
            "--kernels profiles the kernels of a GPU backend (wgpu or cuda), not {}",
            backend.name()
        );
    }
    if args.prompt_tokens >= config.model.block_size {
        anyhow::bail!(
            "--prompt-tokens {} needs a context longer than the prompt: {name} has \
             model.block_size = {}",
            args.prompt_tokens,
            config.model.block_size
        );
    }
    Ok(())
}

/// The engine `train` would open for `config` on `placement`, on a fresh model of the
/// benchmark's vocabulary, and the model's parameter count.
fn open_engine(config: &RunConfig, placement: &Placement) -> Result<(Box<dyn Engine>, usize)> {
    let model = model_of(config, VOCAB, &placement.device.clone().autodiff())?;
    let model = placement.model(model);
    let params = model.num_params();
    let optim = Optimizer::for_run(config, &model, optimizer(config, &model));
    let (kind, _) = placement.engine_for(config.train.dtype, UpdateKind::of(config))?;
    let engine = engine::open(
        placement,
        kind,
        model,
        optim,
        engine::Settings::of(config),
        None,
    )?;
    Ok((engine, params))
}

/// A fresh model of `config` for a vocabulary of `vocab` on `device`, with its `[lora]`
/// adapters when it has them (`--set lora.rank=R`: a LoRA run's step, the base frozen): what a
/// benchmark measures.
pub(crate) fn model_of(
    config: &RunConfig,
    vocab: usize,
    device: &burn::tensor::Device,
) -> Result<Gpt> {
    let kernel = config.train.attention_kernel;
    let model = config.gpt(vocab).init_with_attention(device, kernel)?;
    Ok(match &config.lora {
        Some(lora) => model.with_lora(lora)?,
        None => model,
    })
}

/// Random tokens: the speed of a step does not depend on the text.
pub(crate) fn random_tokens(config: &RunConfig) -> Dataset {
    let mut rng = step_rng(config.train.seed, 0, 0);
    let stream: Vec<u32> = (0..100_000)
        .map(|_| rng.random_range(0..VOCAB as u32))
        .collect();
    Dataset {
        train: Split::Packed(Tokens::from_vec(stream.clone())),
        val: Split::Packed(Tokens::from_vec(stream)),
        block_size: config.model.block_size,
        verification: crate::data::prepare::Verification::none(),
    }
}

/// The median of `iters` real training steps after `warmup`, and the first step (warm-up or
/// not), in seconds (`None` without any: no step runs). Each step's loss is read, so a GPU step
/// is timed to its end (training itself reads it at log intervals only).
fn median_step(
    engine: &mut dyn Engine,
    data: &Dataset,
    config: &RunConfig,
    args: &BenchArgs,
) -> Result<Option<(f64, f64)>> {
    if args.iters == 0 {
        return Ok(None);
    }
    let mut times = Vec::with_capacity(args.iters);
    let mut first = None;
    for step in 0..args.warmup + args.iters {
        let start = Instant::now();
        train_step(engine, data, config, step)?;
        let loss = engine.outcomes(true)?.last().map_or(f64::NAN, |s| s.loss);
        if !loss.is_finite() {
            anyhow::bail!("the loss became {loss} at step {step}");
        }
        let seconds = start.elapsed().as_secs_f64();
        first.get_or_insert(seconds);
        if step >= args.warmup {
            times.push(seconds);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(first.map(|first| (times[times.len() / 2], first)))
}

/// A sampling measurement: the tokens of one pass, the seconds of the first and second pass,
/// and (on a GPU) what a token of a third pass cost.
struct Sampling {
    /// The bytes of matrices a token read (the fused decoder's).
    weight_bytes: Option<usize>,
    tokens: usize,
    first_seconds: f64,
    seconds: f64,
    /// The second read of the `--prompt-tokens` prompt (and one token sampled after it).
    prompt_seconds: Option<f64>,
    cost: Option<TokenCost>,
    /// Whether the batch's step replayed as a graph (`--streams`).
    graph: Option<Replay>,
}

/// Samples with the KV cache from a one-token prompt, the same generation three times: a GPU
/// backend compiles and tunes kernels as new cases come (past the block, the window's rebuild
/// is one), a cost of the first pass only; the second is timed; the third, on a GPU, counted
/// (counting launches costs time of its own).
fn sampling(
    engine: &mut dyn Engine,
    placement: &Placement,
    args: &BenchArgs,
    on_gpu: bool,
) -> Result<Sampling> {
    let inference = args.weights.cast(engine.model()?.valid())?;
    let options = GenerateOptions {
        max_new_tokens: args.sample_tokens,
        temperature: 0.8,
        top_k: None,
        context_shift: args.context_shift,
        ..GenerateOptions::default()
    };
    let (kind, _) = placement.engine_for(TrainDType::F32, OptimizerKind::AdamW)?;
    let weights = args.weights.into();
    let mut decoder = decoder(placement, &inference, inference.vocab_size(), &weights)?;
    let mut batch = match args.streams {
        1 => None,
        n => Some(batch_decoder(kind, &inference, n, &weights)?),
    };
    let mut pass = || -> Result<(usize, f64)> {
        let start = Instant::now();
        let sampled = match batch.as_deref_mut() {
            None => generate(&mut *decoder, &[0], &options, |_| {})?.len(),
            Some(batch) => batched(batch, &options)?,
        };
        Ok((sampled, start.elapsed().as_secs_f64()))
    };
    let ((_, first_seconds), warm) = token_cost::warm_up(&mut pass)?;
    let (tokens, seconds) = pass()?;
    let cost = match on_gpu {
        true => Some(token_cost::count(&warm, || Ok(pass()?.0))?),
        false => None,
    };
    let graph = match &batch {
        Some(batch) => batch.replays(),
        None => decoder.replays(),
    };
    let prompt_seconds = match args.prompt_tokens {
        0 => None,
        n => Some(read_prompt(
            &mut *decoder,
            n,
            inference.vocab_size(),
            &options,
        )?),
    };
    let weight_bytes = match kind {
        EngineKind::Fused => Some(weight_bytes_per_token(
            inference.config(),
            args.weights.format(EngineKind::Fused)?,
        )),
        EngineKind::Autodiff | EngineKind::Device => None,
    };
    Ok(Sampling {
        weight_bytes,
        tokens,
        first_seconds,
        seconds,
        prompt_seconds,
        cost,
        graph,
    })
}

/// The kernels of `steps` sampling steps (`--kernels` with `--iters 0`), each feeding one token
/// to every stream (`--streams`) and reading the logits back, after the same steps once
/// unobserved (their kernels compiled). A recorded step shows as the graph's launch:
/// `TINYGPT_DECODE_STEP=step` shows the kernels inside it.
fn profile_sampling(
    engine: &mut dyn Engine,
    placement: &Placement,
    args: &BenchArgs,
    steps: usize,
) -> Result<KernelProfile> {
    let inference = args.weights.cast(engine.model()?.valid())?;
    let (kind, _) = placement.engine_for(TrainDType::F32, OptimizerKind::AdamW)?;
    let mut batch = batch_decoder(kind, &inference, args.streams, &args.weights.into())?;
    let steps = steps.min(batch.block_size());
    let batch = &mut *batch;
    (0..batch.streams()).for_each(|s| batch.clear(s));
    (0..steps).try_for_each(|_| one_token_each(batch))?;
    (0..batch.streams()).for_each(|s| batch.clear(s));
    profile(steps, |_| one_token_each(batch))
}

/// One step of `batch` feeding token 0 to every stream (the logits read back).
fn one_token_each(batch: &mut dyn BatchDecoder) -> Result<()> {
    let feeds: Vec<(usize, &[u32])> = (0..batch.streams()).map(|s| (s, &[0u32][..])).collect();
    batch.step(&feeds)?;
    Ok(())
}

/// One generation of `options` per stream of `batch`, each from a one-token prompt with a seed
/// of its own, all stepped together as `serve` steps its requests: the tokens sampled in all.
fn batched(batch: &mut dyn BatchDecoder, options: &GenerateOptions) -> Result<usize> {
    let runs: Vec<(Vec<u32>, GenerateOptions)> = (0..batch.streams())
        .map(|s| {
            let seed = options.seed + s as u64;
            (
                vec![0],
                GenerateOptions {
                    seed,
                    ..options.clone()
                },
            )
        })
        .collect();
    Ok(generate_batch(batch, &runs)?.iter().map(Vec::len).sum())
}

/// Seconds to read an `n`-token prompt into the cache and sample one token after it, on the
/// second of two passes (the first warms the kernels and buffers a prompt that long needs).
fn read_prompt(
    decoder: &mut dyn tinygpt_model::Decoder,
    n: usize,
    vocab: usize,
    options: &GenerateOptions,
) -> Result<f64> {
    let prompt: Vec<u32> = (0..n).map(|i| ((i * 7919) % vocab) as u32).collect();
    let options = GenerateOptions {
        max_new_tokens: 1,
        ..options.clone()
    };
    let mut seconds = 0.0;
    for _ in 0..2 {
        let start = Instant::now();
        generate(decoder, &prompt, &options, |_| {})?;
        seconds = start.elapsed().as_secs_f64();
    }
    Ok(seconds)
}

/// Prints a table header for [`row`].
pub fn header() -> String {
    format!(
        "{:<17} {:<8} {:<5} {:>9} {:>12} {:>14} {:>16} {:>16} {:>14}",
        "config",
        "backend",
        "dtype",
        "params",
        "ms/iter",
        "train tok/s",
        "sample tok/s",
        "(first pass)",
        "peak RSS MiB"
    )
}

/// A result as a table row, followed by what a sampled token costs and the kernel profile
/// where there are.
pub fn row(r: &BenchResult) -> String {
    let mut line = format!(
        "{:<17} {:<8} {:<5} {:>9} {:>12} {:>14} {:>16.0} {:>16.0} {:>14}",
        r.config,
        r.backend,
        r.dtype,
        r.params,
        r.ms_per_iter.map_or("-".into(), |ms| format!("{ms:.1}")),
        r.train_tokens_per_s
            .map_or("-".into(), |t| format!("{t:.0}")),
        r.sample_tokens_per_s,
        r.first_sample_tokens_per_s,
        r.peak_rss_mib.map_or("-".into(), |m| format!("{m:.0}"))
    );
    if let Some(first) = r.first_step_s {
        line.push_str(&format!(
            "\n  the first training step took {first:.1} s (compiling and tuning included)"
        ));
    }
    if r.sample_streams > 1 {
        line.push_str(&format!(
            "\n  sampled {} streams at once (tok/s counts them all)",
            r.sample_streams
        ));
    }
    match (r.sample_graph, &r.sample_graph_refused) {
        (Some(true), _) => line.push_str("\n  the sampling step replayed as one graph"),
        (Some(false), Some(why)) => line.push_str(&format!(
            "\n  the sampling step ran launch by launch: {why}"
        )),
        (Some(false), None) => line.push_str("\n  the sampling step ran launch by launch"),
        (None, _) => {}
    }
    if let (Some(bytes), "q8_0") = (r.weight_bytes_per_token, r.weights.as_str()) {
        line.push_str(&format!(
            "\n  sampled with q8_0 matrices: {:.1} MiB read a token",
            bytes as f64 / (1 << 20) as f64
        ));
    }
    if let Some(cost) = &r.sample_cost {
        line.push_str(&format!(
            "\n  per sampled token: {:.1} kernel launches, {:.2} host reads; \
             {} kernels compiled after warm-up",
            cost.launches_per_token, cost.host_reads_per_token, cost.compiles_after_warmup
        ));
    }
    match &r.kernels {
        Some(kernels) => format!("{line}\n{}", table(kernels)),
        None => line,
    }
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
