//! `tinygpt export`: a run's weights for PyTorch.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::checkpoint::{Run, Which};
use tinygpt::interop;

/// Write a run's weights for PyTorch: nanoGPT's parameter names and [out, in] layout.
///
/// Writes FILE.safetensors and FILE.json (nanoGPT's config and tokenizer maps).
#[derive(clap::Args)]
#[command(
    after_help = "Example:\n  tinygpt export --checkpoint runs/default --format nanogpt --out model.safetensors"
)]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Nanogpt)]
    format: Format,
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    /// nanoGPT / Hugging Face GPT-2 parameter names, PyTorch layouts.
    Nanogpt,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let Format::Nanogpt = args.format;
    let run = Run::open(&args.checkpoint)?;
    interop::export(&run, args.which, &args.out)?;
    println!(
        "wrote {} and {} (nanoGPT names, PyTorch [out, in] layout)",
        args.out.display(),
        interop::sidecar_path(&args.out).display()
    );
    Ok(ExitCode::SUCCESS)
}
