//! `tinygpt export`: a run's weights for PyTorch or Hugging Face.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::interop;
use tinygpt::run::checkpoint::{Run, Which};

/// Write a run's weights for other tools.
///
/// --format nanogpt writes FILE.safetensors (nanoGPT's parameter names, PyTorch's [out, in]
/// layout) and FILE.json (nanoGPT's config and tokenizer maps). --format hf writes a directory
/// that transformers loads with GPT2LMHeadModel.from_pretrained and AutoTokenizer.from_pretrained
/// (char vocabularies included).
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  \
    tinygpt export --checkpoint runs/default --format nanogpt --out model.safetensors\n  \
    tinygpt export --checkpoint runs/default --format hf --out hf-model")]
pub struct Args {
    #[arg(long, value_name = "DIR")]
    checkpoint: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Nanogpt)]
    format: Format,
    /// The file (nanogpt) or directory (hf) to write.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
    #[arg(long, value_enum, default_value_t = Which::Best)]
    which: Which,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    /// nanoGPT's parameter names in safetensors, with a JSON sidecar.
    Nanogpt,
    /// A Hugging Face directory: GPT-2 (`GPT2LMHeadModel`) for GPT-2's parts, Llama
    /// (`LlamaForCausalLM`) for rotary positions, RMSNorm and SwiGLU.
    Hf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let run = Run::open(&args.checkpoint)?;
    match args.format {
        Format::Nanogpt => {
            interop::export(&run, args.which, &args.out)?;
            println!(
                "wrote {} and {} (nanoGPT names, PyTorch [out, in] layout)",
                args.out.display(),
                interop::sidecar_path(&args.out).display()
            );
        }
        Format::Hf => {
            let architecture = interop::hf::export(&run, args.which, &args.out)?;
            println!(
                "wrote {} (Hugging Face {architecture}: config.json, model.safetensors, \
                 tokenizer.json)",
                args.out.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
