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
        let message = message.replace('\n', " ");
        if info.location().is_some_and(|at| opengl_driver(at.file())) {
            // wgpu lists the OpenGL adapter beside Vulkan's when Vulkan has only a software
            // one (lavapipe); on a loaded machine that driver may miss wgpu's 6-second lock,
            // on a thread of its own, and the run went on on Vulkan.
            eprintln!(
                "tinygpt: the OpenGL driver did not answer wgpu in time ({message}): a busy \
                 machine's driver, not a bug in tinygpt; if the run stops, run it again or pick \
                 --backend flex"
            );
            return;
        }
        eprintln!(
            "tinygpt: internal error: {message} (this is a bug in tinygpt: please report it \
             with the command you ran, at https://github.com/tinygpt/tinygpt/issues)",
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

/// Whether a panic at `file` is wgpu's OpenGL backend, whose adapter wgpu lists on machines
/// where Vulkan has only a software adapter.
fn opengl_driver(file: &str) -> bool {
    let file = file.replace('\\', "/");
    file.contains("/wgpu-hal-") && file.contains("/src/gles/")
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
    // SAFETY: single-threaded here, nothing else reads the environment concurrently.
    unsafe { tinygpt::distributed::prepare_environment() };
}

#[cfg(test)]
mod tests {
    use super::opengl_driver;

    #[test]
    fn only_wgpus_opengl_backend_counts_as_the_opengl_driver() {
        let registry = "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        let at = |file: &str| opengl_driver(&format!("{registry}/{file}"));
        assert!(at("wgpu-hal-30.0.1/src/gles/egl.rs"));
        assert!(at("wgpu-hal-30.0.1/src/gles/adapter.rs"));
        assert!(opengl_driver(
            r"C:\Users\u\.cargo\registry\src\x\wgpu-hal-30.0.1\src\gles\wgl.rs"
        ));
        assert!(!at("wgpu-hal-30.0.1/src/vulkan/device.rs"));
        assert!(!at("wgpu-core-30.0.1/src/device/mod.rs"));
        assert!(!opengl_driver("crates/trainer/src/commands/train.rs"));
    }
}
