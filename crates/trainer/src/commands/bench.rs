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
    /// Sample with the matrices kept as f32, bf16, f16 or q8_0 (see `generate --weights`).
    #[arg(long, value_enum, default_value_t = Weights::F32)]
    weights: Weights,
    /// Override a key of every config, `section.key=value` (e.g. `train.dtype=bf16`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// After the timed steps, count and time the kernels that N more steps launch, by kind
    /// (GPU backends: wgpu, cuda). Each launch is timed alone, so the times are each kernel's
    /// own cost, not the pipelined step's. With --iters 0: the kernels of N sampling steps
    /// (one token for each of --streams), of which a recorded step shows only its replay.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "3", default_value_t = 0)]
    kernels: usize,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
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
