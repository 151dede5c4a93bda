//! What a sampled token costs a GPU backend besides its arithmetic (`tinygpt bench`): kernels
//! launched, kernels compiled after warm-up, and host reads, per token.
//!
//! A token of a small model is a few dozen small kernels, so its time is mostly launching them
//! and the host waiting for the device, not computing. Three counts say where it goes:
//! - **launches per token**, from CubeCL's launch observer (every launch in the process, on any
//!   thread);
//! - **compiles after warm-up**: the kernels the counted pass launched that the warm-up pass
//!   did not (a kernel is told apart by CubeCL's id, which names its compile-time settings and
//!   shapes too). A decoder whose kernels change with the position, a cache that grows per
//!   token say, compiles on every token; one with fixed shapes compiles none;
//! - **host reads per token**: the decoders' reads back to the host
//!   ([`tinygpt_model::decoding::host_reads`]); each one waits for the device.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;
use cubecl::launched::LaunchedKernels;
use cubecl::logging::{LaunchObservation, LaunchObserver};
use serde::Serialize;

/// Per sampled token, after warm-up; serialised under `tinygpt bench --json`'s names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TokenCost {
    #[serde(rename = "sample_launches_per_token")]
    pub launches_per_token: f64,
    /// Kernels launched in the counted pass that the warm-up pass never launched: each one was
    /// compiled (or loaded and tuned) while sampling.
    #[serde(rename = "sample_compiles_after_warmup")]
    pub compiles_after_warmup: usize,
    #[serde(rename = "sample_host_reads_per_token")]
    pub host_reads_per_token: f64,
}

/// The kernels a warm-up pass launched, to tell the counted pass's new ones from.
pub struct Warm(Vec<u128>);

/// Runs `pass`, noting every kernel it launches.
pub fn warm_up<T>(pass: impl FnOnce() -> Result<T>) -> Result<(T, Warm)> {
    let collecting = LaunchedKernels::new();
    let out = pass()?;
    let mut kernels: Vec<u128> = collecting.finish().into_iter().collect();
    kernels.sort_unstable();
    Ok((out, Warm(kernels)))
}

/// Runs `pass`, which samples and returns how many tokens it sampled, and counts what those
/// tokens cost after `warm`.
pub fn count(warm: &Warm, pass: impl FnOnce() -> Result<usize>) -> Result<TokenCost> {
    let launches = Arc::new(Launches::default());
    let reads_before = tinygpt_model::decoding::host_reads();
    let collecting = LaunchedKernels::new();
    let tokens = {
        let _watching = LaunchObservation::new(launches.clone());
        pass()?
    };
    let launched = collecting.finish();
    let reads = tinygpt_model::decoding::host_reads() - reads_before;
    let per_token = |n: f64| n / tokens.max(1) as f64;
    Ok(TokenCost {
        launches_per_token: per_token(launches.0.load(Ordering::Relaxed) as f64),
        compiles_after_warmup: launched
            .into_iter()
            .filter(|k| warm.0.binary_search(k).is_err())
            .count(),
        host_reads_per_token: per_token(reads as f64),
    })
}

/// Counts launches; times none (timing would serialise them).
#[derive(Default)]
struct Launches(AtomicUsize);

impl LaunchObserver for Launches {
    fn launched(&self, _kernel: &'static str) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}
