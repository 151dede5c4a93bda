//! `tinygpt params`: a config's architecture, parameter count and training memory.

use std::process::ExitCode;

use anyhow::Result;
use burn::tensor::Device;
use tinygpt::config::UpdateKind;
use tinygpt::config::presets::ConfigSource;
use tinygpt::train::memory;

/// Print a config's architecture, parameter count and the memory training it takes.
#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  tinygpt params\n  tinygpt params --config shakespeare-char --vocab-size 65\n  tinygpt params --config my.toml --set model.n_layer=12 --set train.batch_size=4"
)]
pub struct Args {
    /// Run configuration: a built-in preset (default, baby, modern, speedrun, ten-minutes,
    /// shakespeare-char, finetune) or a TOML file.
    #[arg(long, alias = "preset", default_value = "default")]
    config: String,
    /// Override a config key, e.g. --set model.n_layer=8 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// The tokenizer's vocabulary (65 for tiny shakespeare's characters); a config's
    /// `model.vocab_size` pads it.
    #[arg(long, default_value_t = 65)]
    vocab_size: usize,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let run = ConfigSource::parse(&args.config).load(&args.overrides)?;
    run.check_vocab(args.vocab_size)?;
    let config = run.gpt(args.vocab_size);
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
    let t = &run.train;
    let (engine, _) =
        tinygpt::backend::Placement::cpu().engine_for(t.dtype, UpdateKind::of(&run))?;
    let on = engine.on_the_cpu();
    let estimate = memory::Estimate::training(&run, args.vocab_size, engine);
    println!(
        "memory to train with batch {} × {} on the CPU ({on}): ~{}",
        t.batch_size,
        t.grad_accum,
        estimate.describe()
    );
    Ok(ExitCode::SUCCESS)
}
