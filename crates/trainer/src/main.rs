//! `tinygpt`: train a tiny GPT on any text file, sample from it, evaluate it. This binary parses
//! the command line and hands each command to its module in `commands/`.

mod commands;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    prepare_environment();
    // A bug must still end in one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        // `println!` panics when stdout is a pipe closed by its reader (`tinygpt info | head`).
        // End quietly, as Unix tools do; files are only ever replaced by renames, so none is
        // left half-written.
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        eprintln!(
            "tinygpt: internal error: {} (this is a bug in tinygpt: please report it with the \
             command you ran, at https://github.com/tinygpt/tinygpt/issues)",
            message.replace('\n', " ")
        );
    }));
    let cli = commands::Cli::parse();
    match std::panic::catch_unwind(|| commands::run(cli)) {
        Ok(Ok(code)) => code,
        Ok(Err(err)) if broken_pipe(&err) => ExitCode::SUCCESS,
        // Stopped by a signal (its sender may have closed our input, or the handler removed
        // the staging directory): the handler says so and exits 130.
        Ok(Err(_)) if tinygpt::fs::interrupted() => loop {
            std::thread::park();
        },
        Ok(Err(err)) => {
            eprintln!("tinygpt: error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
        Err(_) => ExitCode::from(101),
    }
}

/// Whether `err` comes from writing to a pipe its reader closed.
fn broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Environment defaults, set before any thread starts.
fn prepare_environment() {
    // Burn creates a loaded optimizer state on its default device, which is wgpu when compiled
    // in: resuming a CPU run would start a GPU driver (~90 MiB) or fail without one. Flex as the
    // default avoids that; Burn moves the state to the model's device at its first step.
    if std::env::var_os("BURN_DEVICE").is_none() {
        // SAFETY: no other thread exists yet to read the environment concurrently.
        unsafe { std::env::set_var("BURN_DEVICE", "flex") };
    }
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // Mesa's Vulkan drivers print an error per adapter probe without it (headless boxes);
        // a temp dir is what they would fall back to.
        // SAFETY: single-threaded here, nothing else reads the environment concurrently.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}
