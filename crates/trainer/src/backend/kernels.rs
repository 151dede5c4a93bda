//! Where the GPU backends keep what they learn about their kernels between runs.
//!
//! Burn's GPU backends (wgpu, CUDA) compile each kernel the first time it runs and try several
//! variants of the matmuls and reductions on the device to pick the fastest for each shape
//! (autotune). Done again in every process, that is a minute or more before the first training
//! steps of a small model: a `tinygpt bench` of 3 baby steps and 60 sampled tokens took 99.8 s on
//! lavapipe with nothing kept and 13.3 s the second time, and on an H100 a 7-step bf16 benchmark
//! took 97 s for 31-ms steps (docs/perf.md). So builds with the `kernel-cache` feature (which
//! `cuda` turns on) keep the autotune results, and on CUDA the compiled kernels (PTX; wgpu hands
//! its WGSL to the driver on every run), in the user's cache directory: `$XDG_CACHE_HOME/cubecl`,
//! else `~/.cache/cubecl`. The default build leaves the cache out: it is Burn's `persistence`,
//! an embedded SQL database that costs minutes of every cold build.

use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig, cache::CacheConfig};

/// Installs CubeCL's configuration before any GPU device opens: a `cubecl.toml` (or
/// `burn.toml`'s `[cubecl]` section) in the working directory or above and the `CUBECL_*`
/// variables, as CubeCL reads them itself, with (in `kernel-cache` builds) the compiled-kernel
/// cache turned on and, where the configuration leaves the place to CubeCL's default (the
/// `target/` of an enclosing Cargo project), the user's cache directory instead. A configuration already loaded stays as it is.
pub(crate) fn keep_between_runs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _installed = CubeClRuntimeConfig::try_set(config());
    });
}

/// The configuration [`keep_between_runs`] installs.
fn config() -> CubeClRuntimeConfig {
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    #[cfg(feature = "kernel-cache")]
    {
        config.compilation.cache = true;
    }
    if matches!(config.environment.path, CacheConfig::Target) {
        config.environment.path = CacheConfig::Global;
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is kept goes to the user's cache rather than a Cargo project's `target/` (the tests
    /// run inside one), and `kernel-cache` builds keep the compiled kernels.
    #[test]
    fn kernels_are_kept_in_the_user_cache() {
        let config = config();
        #[cfg(feature = "kernel-cache")]
        assert!(config.compilation.cache);
        assert!(matches!(config.environment.path, CacheConfig::Global));
        assert!(config.environment.path.root().ends_with("cubecl"));
    }
}
