//! A closure captured once as a device graph and replayed: Burn's [`burn::tensor::capture`]
//! and its `Graph`, the same steps, except that a capture the device refused says why.
//!
//! Burn's `capture` falls back to running the closure again when the device will not make a
//! graph of it, silently; a decode step then runs launch by launch at a fifth of its speed with
//! nothing to say so. Here the refusal is kept ([`Replay::Rerun`]) so that `serve` and `bench`
//! can print it.

use burn::tensor::Device;
use burn_backend::{Backend, BackendGraph};
use burn_dispatch::Dispatch;

use crate::sample::Replay;

/// A closure captured on a device, replayed by [`DeviceGraph::replay`].
pub(crate) struct DeviceGraph<T, F> {
    device: Device,
    output: T,
    closure: F,
    graph: Option<BackendGraph<Dispatch>>,
    replay: Replay,
}

/// Captures `closure` on `device` as Burn's `capture` does: a few warm-up runs (autotuning, and
/// every buffer the recording reuses allocated before it starts, since nothing may be
/// allocated inside it), then one run under recording.
pub(crate) fn capture<T, F>(device: &Device, mut closure: F) -> DeviceGraph<T, F>
where
    F: FnMut() -> T,
{
    // Three warm-ups as Burn's: with fusion the first run builds and tunes the fused kernels,
    // and only later runs take the path (and the buffers) the recording sees.
    const WARMUP: usize = 3;
    let dispatch = device.as_dispatch();
    let _ = Dispatch::graph_prepare(dispatch);
    for _ in 0..WARMUP {
        // Held over the sync: a lazy backend skips work whose result is dropped unread.
        let out = closure();
        let _ = Dispatch::sync(dispatch);
        drop(out);
    }
    let (graph, output, replay) = match Dispatch::graph_start_capture(dispatch) {
        Ok(()) => {
            let output = closure();
            match Dispatch::graph_stop_capture(dispatch) {
                Ok(graph) => (Some(graph), output, Replay::Graph),
                Err(e) => (None, output, rerun(&e.to_string())),
            }
        }
        Err(e) => (None, closure(), rerun(&e.to_string())),
    };
    DeviceGraph {
        device: device.clone(),
        output,
        closure,
        graph,
        replay,
    }
}

impl<T, F> DeviceGraph<T, F>
where
    F: FnMut() -> T,
{
    /// Runs the recording again and returns its output: one graph launch on the buffers the
    /// recording used, or the closure run again.
    ///
    /// # Safety
    ///
    /// As Burn's `Graph::replay`: every tensor the closure read or wrote is still alive, none
    /// is used by another stream or thread while the replay runs, and the inputs written
    /// before it and the output read after it are issued from the thread that recorded it.
    pub(crate) unsafe fn replay(&mut self) -> &T {
        match &self.graph {
            Some(graph) => {
                // Safety: forwarded from this method's contract.
                unsafe { Dispatch::graph_replay(self.device.as_dispatch(), graph) }
                    .expect("a recorded graph replays on the device it was recorded on");
            }
            None => self.output = (self.closure)(),
        }
        &self.output
    }

    /// Whether it replays as one graph, and if not, why.
    pub(crate) fn replays(&self) -> &Replay {
        &self.replay
    }
}

/// The refusal on one line: Burn's errors read "An error happened during execution / Caused
/// by: / <reason>"; the reason is what a person can act on.
fn rerun(error: &str) -> Replay {
    let reason = error.rsplit("Caused by:").next().unwrap_or(error);
    Replay::Rerun {
        why: reason.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DeviceType, Tensor};

    /// Records a closure that uploads a new value each run (a write from the host, which no
    /// recording can hold) and replays it once: the replay's value, and how it replayed.
    fn uploads(device: &Device) -> (f32, Replay) {
        let mut runs = 0;
        let mut captured = capture(device, || {
            runs += 1;
            Tensor::<1>::from_floats([runs as f32], device)
        });
        // Safety: the closure owns what it touches.
        let out = unsafe { captured.replay() }.clone();
        let value = out.into_data().try_to_vec::<f32>().unwrap()[0];
        (value, captured.replays().clone())
    }

    #[test]
    fn a_backend_without_graphs_reruns_the_closure_and_says_why() {
        let (value, replays) = uploads(&Device::flex());
        // Three warm-ups and the recording's own run, then the replay runs it again.
        assert_eq!(value, 5.0);
        let Replay::Rerun { why } = replays else {
            panic!("flex records no graph");
        };
        assert!(why.contains("not supported"), "{why}");
        assert!(!why.contains('\n'), "{why}");
    }

    /// wgpu records graphs, but not a write from the host inside one: the device's reason is
    /// kept, and the closure runs again, right.
    #[test]
    #[cfg_attr(
        no_wgpu,
        ignore = "no wgpu adapter on this machine (install mesa-vulkan-drivers, then rebuild)"
    )]
    fn a_recording_the_device_refuses_says_why_and_runs_again() {
        let wgpu = Device::enumerate(DeviceType::Wgpu).into_vec().remove(0);
        let (value, replays) = uploads(&wgpu);
        assert_eq!(value, 5.0);
        let Replay::Rerun { why } = replays else {
            panic!("a host write inside a recording makes no graph");
        };
        assert!(why.contains("write"), "{why}");
    }
}
