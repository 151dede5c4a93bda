//! `tinygpt bench`: training and sampling speed and peak memory.

use std::process::ExitCode;

use anyhow::Result;
use tinygpt::backend::Backend;
use tinygpt::bench::{self, BenchArgs};

/// Measure training and sampling speed and peak memory (table, or JSON lines).
///
/// Training: the median of --iters real training steps (forward, backward, clipping, AdamW)
/// after --warmup, on random tokens. Sampling: --sample-tokens from a one-token prompt with
/// the KV cache (past block_size, nanoGPT's sliding window unless --context-shift). Run nothing else meanwhile: on a small machine contention distorts timings.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt bench\n  tinygpt bench --config baby --config shakespeare-char --backend flex --backend ndarray --json\n  tinygpt bench --config shakespeare-char --backend wgpu"
)]
pub struct Args {
    /// Configs to measure: presets (baby, shakespeare-char, default) or TOML files.
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
    /// Sample with the context shift (see `generate --context-shift`).
    #[arg(long)]
    context_shift: bool,
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
        context_shift: args.context_shift,
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
