//! `tinygpt`: the command-line front door.
//!
//! Training, generation and evaluation arrive with the trainer (see README.md's status); today
//! the binary reports the architecture of the model presets.

use std::process::ExitCode;

use burn::tensor::Device;
use clap::{Parser, Subcommand, ValueEnum};
use tinygpt_model::GptConfig;

#[derive(Parser)]
#[command(
    name = "tinygpt",
    version,
    about = "Train and sample a tiny GPT on any text file"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a preset's architecture and parameter count.
    ///
    /// Example: tinygpt params --preset shakespeare-char --vocab-size 65
    Params {
        /// Which preset.
        #[arg(long, value_enum, default_value_t = Preset::Baby)]
        preset: Preset,
        /// Vocabulary size (65 for tiny-shakespeare's characters).
        #[arg(long, default_value_t = 65)]
        vocab_size: usize,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Preset {
    /// nanoGPT's CPU baby model: 4 layers, 4 heads, 128 wide, block 64.
    Baby,
    /// nanoGPT's shakespeare-char model: 6 layers, 6 heads, 384 wide, block 256.
    ShakespeareChar,
    /// The seeds' bare model: embeddings, one attention head, linear head.
    Minimal,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Params { preset, vocab_size } => {
            let config = match preset {
                Preset::Baby => GptConfig::baby(vocab_size),
                Preset::ShakespeareChar => GptConfig::shakespeare_char(vocab_size),
                Preset::Minimal => GptConfig::minimal(vocab_size),
            };
            let model = match config.init(&Device::flex()) {
                Ok(model) => model,
                Err(err) => {
                    eprintln!("tinygpt: {err}");
                    return ExitCode::FAILURE;
                }
            };
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
            println!(
                "{} parameters ({:.2}M without the position embedding, as nanoGPT counts)",
                model.num_params(),
                model.num_params_non_embedding() as f64 / 1e6
            );
        }
    }
    ExitCode::SUCCESS
}
