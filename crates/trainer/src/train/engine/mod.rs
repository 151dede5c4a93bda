//! The training engine: it owns the model's weights and the optimizer's state, computes losses,
//! gradients and updates, and hands out an up-to-date [`Gpt`] (or checkpoint bytes) on request.
//!
//! [`Engine`] is what the training loop, evaluation, checkpoints and `bench` talk to; which
//! implementation runs is [`EngineKind`], decided once by [`Placement::engine_for`] and built by
//! [`open`]:
//!
//! ```text
//! autodiff.rs   Burn's autodiff and Burn's optimizer (AdamW, or Muon beside it) on a CPU
//!               backend, or on a GPU for an update the device engine does not run (Muon); each
//!               step's loss and norm read back at once (two floats) to decide whether to apply it
//! device.rs     Burn's autodiff on a GPU with DeviceAdamW: the non-finite guard decides on the
//!               device, and a step's outcome is read back only when asked for
//! fused.rs      the model crate's fused CPU engine: weights and the optimizer's state (AdamW's
//!               moments, Muon's momentum) in its own buffers, written into the Gpt and Burn's
//!               optimizer record only when asked for
//! burn_step.rs  what the two Burn engines share: gradients in a precision, clipping, losses
//! ```
//!
//! Whichever runs, the rest of the program cannot see stale weights: [`Engine::model`] and
//! [`Engine::optimizer_bytes`] bring them up to date first.

mod autodiff;
mod burn_step;
mod device;
mod fused;
#[cfg(test)]
mod tests;

use anyhow::Result;
use tinygpt_model::Gpt;

use crate::backend::{EngineKind, Placement};
use crate::config::TrainDType;
use crate::data::Batch;
use crate::train::optim::Optimizer;

/// Trains one model; see the module docs. Every method may be called in any order.
pub trait Engine {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;

    /// A short description for the log line, e.g. `fused CPU engine on 2 threads`.
    fn describe(&self) -> String;

    /// The model with the latest weights.
    fn model(&mut self) -> Result<&Gpt>;

    /// The optimizer's state as Burn serialises it (`optimizer.bpk`), up to date.
    fn optimizer_bytes(&mut self) -> Result<Vec<u8>>;

    /// One optimizer step: gradients of the mean loss over `batches` (each weighted equally, as
    /// gradient accumulation does), clipped to the global norm `grad_clip` (0 = no clipping),
    /// then the optimizer's update (AdamW, or Muon beside it) at learning rate `lr`, unless the
    /// loss or the norm is not finite (see
    /// [`Step::applied`]). Dropout masks derive from `dropout_seed`. What the step saw comes
    /// from [`Engine::outcomes`].
    fn step(&mut self, batches: &[Batch], dropout_seed: u64, grad_clip: f64, lr: f64)
    -> Result<()>;

    /// What the steps taken since the last call saw, in order, each handed out once. An engine
    /// that keeps outcomes on a GPU reads them in one transfer when `wait` is set (which waits
    /// for the device to finish them); without it only outcomes already known come back.
    fn outcomes(&mut self, wait: bool) -> Result<Vec<Step>>;

    /// Mean loss of each batch under the current weights (no gradients, no dropout), in the
    /// precision the steps compute in.
    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>>;
}

/// What an engine says when asked for its model while an update replaces it (a bug).
const LOST: &str = "the engine lost its model";

/// What one optimizer step saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The mean loss over the step's batches.
    pub loss: f64,
    /// The global gradient norm, before clipping.
    pub grad_norm: f64,
    /// Whether the update was applied: it is skipped when the loss or the norm is NaN or
    /// infinite, so one bad batch cannot poison the weights or the optimizer's state.
    pub applied: bool,
}

impl Step {
    /// A step that saw `loss` and `grad_norm`; applied when both are finite.
    fn new(loss: f64, grad_norm: f64) -> Self {
        Self {
            loss,
            grad_norm,
            applied: loss.is_finite() && grad_norm.is_finite(),
        }
    }
}

/// The engine `kind` ([`Placement::engine_for`]'s choice, made once by the caller) for `model`
/// on the autodiff form of `placement`'s device and `optimizer`, its steps computing in `dtype`
/// on `threads` threads.
pub fn open(
    placement: &Placement,
    kind: EngineKind,
    model: Gpt,
    optimizer: Optimizer,
    threads: usize,
    dtype: TrainDType,
) -> Result<Box<dyn Engine>> {
    // Every engine reads the config beside the weights (the fused ones build their buffers
    // from it, checkpoints save it): they must agree.
    model.check_config()?;
    let device = placement.device.clone();
    Ok(match kind {
        EngineKind::Autodiff => Box::new(autodiff::AutodiffEngine::new(
            model, optimizer, device, threads, dtype,
        )),
        EngineKind::Device => Box::new(device::DeviceEngine::new(
            model, optimizer, device, threads, dtype,
        )?),
        EngineKind::Fused => Box::new(fused::FusedEngine::new(model, optimizer, threads)?),
    })
}
