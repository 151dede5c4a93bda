//! `tinygpt watch`: a live page of training runs.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use tinygpt::watch::{WatchOptions, watch};

/// Follow runs as they train, in the browser: loss curves of several runs on one chart (log
/// scale, smoothing), tokens/s, the sample of each evaluation, and the attention of a fixed
/// prompt at each evaluation, on a slider across training. Finished runs show the same way.
///
/// The page updates itself as the runs' files grow (steps.csv, evals.jsonl); it works offline
/// and on a phone. Ctrl-C stops it.
#[derive(clap::Args)]
#[command(after_help = "Examples:\n  tinygpt watch runs/default\n  \
    tinygpt train --config baby --out runs/a & tinygpt watch runs/a runs/default")]
pub struct Args {
    /// Run directories (the --out of tinygpt train); one that does not exist yet is shown once
    /// training makes it.
    #[arg(required = true, value_name = "RUN")]
    runs: Vec<PathBuf>,
    /// Address to listen on. Anything but loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port (0 = any free port; the one chosen is printed).
    #[arg(long, default_value_t = 8081)]
    port: u16,
    /// Require this key (open the page as /?key=KEY); default: the environment variable
    /// TINYGPT_API_KEY.
    #[arg(long, value_name = "KEY")]
    api_key: Option<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let options = WatchOptions {
        runs: args.runs,
        addr: SocketAddr::new(args.host, args.port),
        api_key: args
            .api_key
            .or_else(|| std::env::var("TINYGPT_API_KEY").ok())
            .filter(|k| !k.is_empty()),
    };
    let count = options.runs.len();
    watch(options, |addr| {
        println!("tinygpt: watching {count} run(s) on http://{addr}/");
    })?;
    Ok(ExitCode::SUCCESS)
}
