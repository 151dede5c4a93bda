//! `tinygpt params`: a preset's architecture and parameter count.

use std::process::ExitCode;

use anyhow::Result;
use burn::tensor::Device;
use tinygpt::config::{TrainDType, UpdateKind};
use tinygpt::train::memory;
use tinygpt_model::GptConfig;

/// Print a preset's architecture and parameter count.
#[derive(clap::Args)]
#[command(after_help = "Example:\n  tinygpt params --preset shakespeare-char --vocab-size 65")]
pub struct Args {
    /// Which preset.
    #[arg(long, value_enum, default_value_t = Preset::Baby)]
    preset: Preset,
    /// Vocabulary size (65 for tiny-shakespeare's characters).
    #[arg(long, default_value_t = 65)]
    vocab_size: usize,
    /// Sequences per micro-batch, for the memory estimate.
    #[arg(long, default_value_t = 12)]
    batch_size: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Preset {
    /// nanoGPT's CPU baby model: 4 layers, 4 heads, 128 wide, block 64.
    Baby,
    /// nanoGPT's shakespeare-char model: 6 layers, 6 heads, 384 wide, block 256.
    ShakespeareChar,
    /// The bare model: embeddings, one attention head with its residual, a linear head.
    Minimal,
    /// The baby model's sizes with nanochat's parts: rotary positions, parameter-free RMSNorm,
    /// QK-norm, ReLU², no biases, an untied head, soft-capped logits, zero-initialised
    /// projections.
    Modern,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let config = match args.preset {
        Preset::Baby => GptConfig::baby(args.vocab_size),
        Preset::ShakespeareChar => GptConfig::shakespeare_char(args.vocab_size),
        Preset::Minimal => GptConfig::minimal(args.vocab_size),
        Preset::Modern => GptConfig::modern(args.vocab_size),
    };
    let model = config.init(&Device::flex())?;
    println!(
        "{} layers, {} heads, n_embd {}, block {}, vocab {}, bias {}, tied head {}",
        config.n_layer,
        config.n_head,
        config.n_embd,
        config.block_size,
        config.vocab_size,
        config.bias,
        config.tie_embeddings
    );
    println!("parts: {}", config.parts());
    println!(
        "{} parameters ({:.2}M without the position embedding, as nanoGPT counts)",
        model.num_params(),
        model.num_params_non_embedding() as f64 / 1e6
    );
    let (engine, _) =
        tinygpt::backend::Placement::cpu().engine_for(TrainDType::F32, UpdateKind::default())?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let on = engine.on_the_cpu();
    let work = memory::Work {
        batch_size: args.batch_size,
        grad_accum: 1,
        threads,
        checkpointing: false,
        lora: None,
    };
    println!(
        "memory to train with batch {} on the CPU ({on}): ~{}",
        args.batch_size,
        memory::Estimate::for_model(&config, work, engine).describe()
    );
    Ok(ExitCode::SUCCESS)
}
