//! The command line: one module per command, each with its `Args` and `run`.

mod attention;
mod bench;
mod eval;
mod export;
mod generate;
mod import;
mod info;
mod load;
mod logits;
mod params;
mod prepare;
mod serve;
mod train;
mod watch;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tinygpt",
    version,
    about = "Train and sample a tiny GPT on any text file",
    after_help = "Examples:\n  tinygpt train                                   # the default config on the built-in Paradise Lost\n  tinygpt train --config baby --data input.txt --out runs/baby\n  tinygpt generate --checkpoint runs/default --prompt \"Of Man's first\"\n  tinygpt eval --checkpoint runs/default\n  tinygpt info --checkpoint runs/default"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Prepare(prepare::Args),
    Train(train::Args),
    Generate(generate::Args),
    Eval(eval::Args),
    Info(info::Args),
    Attention(attention::Args),
    Serve(serve::Args),
    Watch(watch::Args),
    Export(export::Args),
    Import(import::Args),
    Bench(bench::Args),
    Logits(logits::Args),
    Params(params::Args),
}

/// Runs the parsed command. Started by an MPI launcher as one of several ranks, `train` trains
/// one run over them, and `bench --all-reduce` times their all-reduce; any other command
/// refuses (each rank would do the same work).
pub fn run(cli: Cli) -> Result<ExitCode> {
    let command = match cli.command {
        Command::Train(args) => return train::run(args, tinygpt::distributed::start()?),
        Command::Bench(args) if args.times_all_reduce() => return bench::run(args),
        command => command,
    };
    if let Some(launch) = tinygpt::distributed::Launch::detect()?.filter(|l| l.size > 1) {
        anyhow::bail!(
            "{} started {} ranks: only `tinygpt train` runs over several; start this command \
             as one process",
            launch.launcher,
            launch.size
        );
    }
    match command {
        Command::Train(_) => unreachable!("trained above"),
        Command::Generate(args) => generate::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Info(args) => info::run(args),
        Command::Attention(args) => attention::run(args),
        Command::Export(args) => export::run(args),
        Command::Import(args) => import::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Logits(args) => logits::run(args),
        Command::Params(args) => params::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Watch(args) => watch::run(args),
    }
}
