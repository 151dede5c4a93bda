//! The kernels a GPU training step launches, by kind: how many per step and how long each
//! kind runs, from CubeCL's launch observer (`tinygpt bench --kernels`).
//!
//! Every kernel launch the process issues, on any thread, is counted under its name while
//! the profiled steps run. Each launch is also timed alone (CubeCL waits for it to finish
//! before the next is issued), so a kind's time is its own cost, and their sum is more than
//! the pipelined step takes. Where the device cannot time a kernel, CubeCL times it on the
//! host around a blocking submit; the profile says so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use anyhow::Result;
use cubecl::config::{TypeNameFormatLevel, type_name_format};
use cubecl::logging::{Duration, LaunchObservation, LaunchObserver, TimingMethod, TimingRequest};
use serde::Serialize;

/// What the profiled steps launched.
#[derive(Debug, Clone, Serialize)]
pub struct KernelProfile {
    /// Steps profiled.
    pub steps: usize,
    /// Kernel launches per step, all kinds.
    pub launches_per_step: f64,
    /// Whether every launch was timed on the device (else some were timed on the host).
    pub device_timed: bool,
    /// By kind, the most time first.
    pub kinds: Vec<KernelKind>,
}

/// One kind of kernel (its name without module path and generics).
#[derive(Debug, Clone, Serialize)]
pub struct KernelKind {
    pub name: String,
    pub launches_per_step: f64,
    /// Milliseconds per step, each launch timed alone.
    pub ms_per_step: f64,
}

/// Launches and time by the kernel's full name.
#[derive(Default)]
struct Observer {
    launches: Mutex<HashMap<&'static str, (usize, f64)>>,
    host_timed: Mutex<bool>,
}

impl LaunchObserver for Observer {
    fn launched(&self, kernel: &'static str) {
        let mut launches = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        launches.entry(kernel).or_default().0 += 1;
    }

    fn timing(&self) -> TimingRequest {
        TimingRequest::Resolved
    }

    fn timed(&self, kernel: &'static str, duration: Duration, method: TimingMethod) {
        let mut launches = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        launches.entry(kernel).or_default().1 += duration.as_secs_f64();
        if method == TimingMethod::System {
            *self.host_timed.lock().unwrap_or_else(|e| e.into_inner()) = true;
        }
    }
}

/// Runs `step` for steps `0..steps` under the launch observer; `step` must end with the step
/// finished on the device (its loss read back), so that no launch of it is left unissued.
pub fn profile(steps: usize, mut step: impl FnMut(usize) -> Result<()>) -> Result<KernelProfile> {
    let observer = Arc::new(Observer::default());
    {
        let _watching = LaunchObservation::new(observer.clone());
        for i in 0..steps {
            step(i)?;
        }
    }
    let launches =
        std::mem::take(&mut *observer.launches.lock().unwrap_or_else(|e| e.into_inner()));
    let mut kinds: HashMap<String, (usize, f64)> = HashMap::new();
    for (name, (count, seconds)) in launches {
        let kind = kinds
            .entry(type_name_format(name, TypeNameFormatLevel::Short))
            .or_default();
        kind.0 += count;
        kind.1 += seconds;
    }
    let per_step = |n: f64| n / steps.max(1) as f64;
    let mut kinds: Vec<KernelKind> = kinds
        .into_iter()
        .map(|(name, (count, seconds))| KernelKind {
            name,
            launches_per_step: per_step(count as f64),
            ms_per_step: per_step(seconds * 1e3),
        })
        .collect();
    kinds.sort_by(|a, b| b.ms_per_step.total_cmp(&a.ms_per_step));
    let host_timed = *observer
        .host_timed
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Ok(KernelProfile {
        steps,
        launches_per_step: kinds.iter().map(|k| k.launches_per_step).sum(),
        device_timed: !host_timed,
        kinds,
    })
}

/// The profile as a table: one line per kind, then the totals.
pub fn table(profile: &KernelProfile) -> String {
    let mut lines = vec![format!(
        "  {:<44} {:>12} {:>12}",
        "kernel", "launches/step", "ms/step"
    )];
    for kind in &profile.kinds {
        lines.push(format!(
            "  {:<44} {:>12.1} {:>12.3}",
            kind.name, kind.launches_per_step, kind.ms_per_step
        ));
    }
    let total: f64 = profile.kinds.iter().map(|k| k.ms_per_step).sum();
    lines.push(format!(
        "  {:<44} {:>12.1} {:>12.3}  ({} steps; each launch timed alone{})",
        "total",
        profile.launches_per_step,
        total,
        profile.steps,
        match profile.device_timed {
            true => " on the device",
            false => ", some on the host",
        }
    ));
    lines.join("\n")
}
