//! `tinygpt bench`: training and sampling speed and peak memory.

use std::process::ExitCode;
use tinygpt::decoder::Weights;

use anyhow::Result;
use tinygpt::backend::Backend;
use tinygpt::bench::{self, BenchArgs};

/// Measure training and sampling speed and peak memory (table, or JSON lines).
///
/// Training: the median of --iters real training steps (forward, backward, clipping, AdamW)
/// after --warmup, on random tokens (--iters 0: none, sampling only). Sampling: --sample-tokens from a one-token prompt with
/// the KV cache (past block_size, nanoGPT's sliding window unless --context-shift), timed on
/// its second pass; on a GPU backend a third pass counts what a token costs (kernel launches,
/// host reads, kernels compiled after the first pass). Prompt: with --prompt-tokens P, a
/// P-token prompt read into the KV cache (and one token sampled after it), timed on its second
/// pass. Run nothing else meanwhile: on a small machine contention distorts timings.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt bench\n  tinygpt bench --config baby --config shakespeare-char --backend flex --backend ndarray --json\n  tinygpt bench --config shakespeare-char --backend wgpu\n  tinygpt bench --config shakespeare-char --backend cuda --set train.dtype=bf16 --kernels"
)]
pub struct Args {
    /// Configs to measure: presets (baby, modern, speedrun, ten-minutes, shakespeare-char, default) or
    /// TOML files.
    #[arg(long = "config", default_values_t = ["baby".to_string()])]
    configs: Vec<String>,
    /// Backends to measure.
    #[arg(long = "backend", value_enum, default_values_t = [Backend::Fused])]
    backends: Vec<Backend>,
    #[arg(long, default_value_t = 20)]
    iters: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 500)]
    sample_tokens: usize,
    /// Also time reading a prompt of N tokens (llama-bench's pp512 is N = 512; 0 = not).
    #[arg(long, value_name = "N", default_value_t = 0)]
    prompt_tokens: usize,
    /// Sample with the context shift (see `generate --context-shift`).
    #[arg(long)]
    context_shift: bool,
    /// Sample N sequences at once, stepped together as `serve` steps its requests (tokens/s
    /// counts them all).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    streams: u64,
    /// Sample with the matrices kept as f32, bf16, f16, q8_0, q5_0 or q4_0 (see `generate --weights`).
    #[arg(long, value_enum, default_value_t = Weights::F32)]
    weights: Weights,
    /// Override a key of every config, `section.key=value` (e.g. `train.dtype=bf16`, or
    /// `lora.rank=16` for a LoRA run's step on a frozen base); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// After the timed steps, count and time the kernels that N more steps launch, by kind
    /// (GPU backends: wgpu, cuda). Each launch is timed alone, so the times are each kernel's
    /// own cost, not the pipelined step's. With --iters 0: the kernels of N sampling steps
    /// (one token for each of --streams), of which a recorded step shows only its replay.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "3", default_value_t = 0)]
    kernels: usize,
    /// Under `mpirun -np N` (a build with MPI): time the all-reduce of each config's trained
    /// gradients instead, as a step over N ranks adds them up (one tensor at a time, and as one
    /// buffer), --iters rounds after --warmup; `--set lora.rank=R` for a LoRA run's adapters,
    /// `--vocab` for a model's vocabulary.
    #[arg(long)]
    all_reduce: bool,
    /// With --all-reduce: the model's vocabulary (tiny shakespeare's characters otherwise).
    #[arg(long, value_name = "N", requires = "all_reduce")]
    vocab: Option<usize>,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Whether this is `--all-reduce`, which runs under a launcher's ranks.
    pub fn times_all_reduce(&self) -> bool {
        self.all_reduce
    }
}

pub fn run(args: Args) -> Result<ExitCode> {
    if args.all_reduce {
        return all_reduce(args);
    }
    if !args.json {
        println!("{}", bench::header());
    }
    let json = args.json;
    let args = BenchArgs {
        configs: args.configs,
        backends: args.backends,
        iters: args.iters,
        warmup: args.warmup,
        sample_tokens: args.sample_tokens,
        prompt_tokens: args.prompt_tokens,
        context_shift: args.context_shift,
        streams: args.streams as usize,
        weights: args.weights,
        overrides: args.overrides,
        kernel_steps: args.kernels,
    };
    bench::bench(&args, |result| {
        if json {
            println!("{}", serde_json::to_string(result).expect("serialisable"));
        } else {
            println!("{}", bench::row(result));
        }
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `--all-reduce`: the all-reduce of each config's trained gradients over the ranks the
/// launcher started; rank 0 prints.
fn all_reduce(args: Args) -> Result<ExitCode> {
    use tinygpt::config::presets::ConfigSource;
    use tinygpt::distributed::cost;
    let Some(ranks) = tinygpt::distributed::start()? else {
        anyhow::bail!(
            "--all-reduce times what ranks add up: start it under a launcher with two ranks or \
             more (mpirun -np 2 tinygpt bench --all-reduce), in a build with MPI"
        );
    };
    // Every config read before anything is timed or printed: a bad name is one line.
    let configs = (args.configs.iter())
        .map(|name| Ok((name, ConfigSource::parse(name).load(&args.overrides)?)))
        .collect::<Result<Vec<_>>>()?;
    let vocab = args.vocab.unwrap_or(tinygpt::bench::VOCAB);
    let latency = cost::latency(&ranks, args.iters.max(100));
    if ranks.leads() && !args.json {
        println!(
            "{} ranks on {}; an all-reduce of 4 bytes takes {:.1} µs",
            ranks.size(),
            ranks.host(),
            latency * 1e6
        );
        println!(
            "{:<16} {:>12} {:>10} {:>8} {:>14} {:>14} {:>14} {:>10}",
            "config",
            "trained",
            "MB",
            "tensors",
            "per tensor ms",
            "one buffer ms",
            "overlapped ms",
            "bus GB/s"
        );
    }
    for (name, config) in &configs {
        let c = cost::reduce_cost(&ranks, name, config, vocab, args.warmup, args.iters)?;
        if !ranks.leads() {
            continue;
        }
        if args.json {
            let mut value = serde_json::to_value(&c)?;
            value["latency_s"] = latency.into();
            println!("{value}");
        } else {
            let overlapped = c
                .overlapped_s
                .map_or("-".to_string(), |s| format!("{:.3}", s * 1e3));
            println!(
                "{:<16} {:>12} {:>10.2} {:>8} {:>14.3} {:>14.3} {:>14} {:>10.2}",
                c.config,
                c.trained_params,
                c.bytes as f64 / 1e6,
                c.tensors,
                c.per_tensor_s * 1e3,
                c.one_buffer_s * 1e3,
                overlapped,
                c.bus_bytes_per_s / 1e9
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
