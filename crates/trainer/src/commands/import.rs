//! `tinygpt import`: a run directory from exported weights.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::interop;

/// Build a run directory from nanoGPT-named weights (and their .json sidecar).
#[derive(clap::Args)]
#[command(after_help = "Example:\n  tinygpt import --from model.safetensors --out runs/imported")]
pub struct Args {
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// The run directory to create.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<ExitCode> {
    interop::import(&args.from, &args.out)?;
    println!(
        "wrote run {} from {}",
        args.out.display(),
        args.from.display()
    );
    Ok(ExitCode::SUCCESS)
}
