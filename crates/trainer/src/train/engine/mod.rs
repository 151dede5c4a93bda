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

use std::path::Path;

use anyhow::Result;
use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Device, Tensor};
use tinygpt_model::{Decoder, Gpt};

use crate::backend::{EngineKind, Placement};
use crate::config::{RunConfig, TrainDType};
use crate::data::Batch;
use crate::distributed::Ranks;
use crate::run::checkpoint::WriteFile;
use crate::train::optim::Optimizer;

/// What samples a snapshot's tokens on a decoder: [`Engine::sampled`].
pub type Sampler<'a> = &'a mut dyn FnMut(&mut dyn Decoder) -> Result<Vec<u32>>;

/// Trains one model; see the module docs. Every method may be called in any order.
pub trait Engine {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;

    /// A short description for the log line, e.g. `fused CPU engine on 2 threads`.
    fn describe(&self) -> String;

    /// The model with the latest weights.
    fn model(&mut self) -> Result<&Gpt>;

    /// The model to read the architecture and parameter shapes of, never its values: the
    /// fused engine's hollow one, which costs nothing to hand out (the model with its weights
    /// lends a base held quantised out in f32).
    fn shapes(&mut self) -> Result<&Gpt> {
        self.model()
    }

    /// The attention weights of `prompt` under the latest weights, `maps[layer][head]` each
    /// `[seq, seq]`, where the engine computes them itself (the fused engine); `None` where
    /// they come from [`model`](Self::model)'s forward.
    fn attention_maps(&mut self, prompt: &[u32]) -> Result<Option<Vec<Vec<Vec<f32>>>>> {
        let _ = prompt;
        Ok(None)
    }

    /// What `sample` returns, run on a decoder of the latest weights where the engine makes one
    /// of its own (the fused engine's LoRA runs: nothing lent, the base multiplied from the
    /// blocks it is held in); `None` where samples come from [`model`](Self::model)'s decoder.
    fn sampled(&mut self, sample: Sampler<'_>) -> Result<Option<Vec<u32>>> {
        let _ = sample;
        Ok(None)
    }

    /// The optimizer's state as Burn serialises it (`optimizer.bpk`), up to date.
    fn optimizer_bytes(&mut self) -> Result<Vec<u8>>;

    /// What a checkpoint writes: the model with the latest weights, and what writes
    /// [`optimizer_bytes`](Self::optimizer_bytes)' bytes to a file (`optimizer.bpk`): the
    /// bytes in hand, or (the fused engine) the state shared and written a tensor at a time.
    /// Both borrow the engine, so no step can run while either lives.
    fn saving(&mut self) -> Result<Saving<'_>> {
        let bytes = self.optimizer_bytes()?;
        Ok(Saving {
            model: self.model()?,
            optimizer: Box::new(move |path: &Path| crate::fs::write_synced(path, &bytes)),
        })
    }

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

    /// SHA-256 of the weights' values: what the ranks of one run compare at each checkpoint.
    fn weights_checksum(&mut self) -> Result<[u8; 32]> {
        Ok(crate::run::weights::weights_checksum(self.model()?))
    }
}

/// What a checkpoint of an engine writes: see [`Engine::saving`].
pub struct Saving<'a> {
    pub model: &'a Gpt,
    /// Writes the optimizer's state to the path it is given, once.
    pub optimizer: WriteFile<'a>,
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

/// Makes every float parameter again on its device: the same id, values and gradient
/// requirement.
struct MadeOn(Device);

impl ModuleMapper for MadeOn {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let made = Tensor::from_data(tensor.into_data(), &self.0).set_require_grad(require_grad);
        Param::from_mapped_value(id, made, mapper)
    }
}

/// How an engine computes a run's steps, from its `[train]` section.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// Threads of the fused engine's steps and of the loss estimates.
    pub threads: usize,
    /// The precision of the steps' matmuls.
    pub dtype: TrainDType,
    /// Activation checkpointing (`train.checkpointing`): the fused engine recomputes each
    /// block's forward in its backward; Burn's engines run on an autodiff device with Burn's
    /// balanced checkpointing strategy.
    pub checkpointing: bool,
}

impl Settings {
    /// What `config` asks for.
    pub fn of(config: &RunConfig) -> Self {
        Self {
            threads: config.workers(),
            dtype: config.train.dtype,
            checkpointing: config.train.checkpointing,
        }
    }

    /// What `config` asks for on one of `ranks`: unless `train.threads` says, the host's
    /// cores shared by its ranks (2 ranks on 2 cores run a thread each, never 4).
    pub fn for_ranks(config: &RunConfig, ranks: &Ranks) -> Self {
        let mut settings = Self::of(config);
        if config.train.threads == 0 {
            let cores = config.workers();
            settings.threads = crate::distributed::threads_per_rank(cores, ranks.local_size());
        }
        settings
    }
}

/// The engine `kind` ([`Placement::engine_for`]'s choice, made once by the caller) for `model`
/// on the autodiff form of `placement`'s device and `optimizer`, its steps computed as
/// `settings` say; with `ranks`, each step's micro-batches dealt to them and their gradients
/// added up (the fused engine alone, so far).
pub fn open(
    placement: &Placement,
    kind: EngineKind,
    model: Gpt,
    optimizer: Optimizer,
    settings: Settings,
    ranks: Option<&Ranks>,
) -> Result<Box<dyn Engine>> {
    // Every engine reads the config beside the weights (the fused ones build their buffers
    // from it, checkpoints save it): they must agree.
    model.check_config()?;
    let device = placement.device.clone();
    let Settings {
        threads,
        dtype,
        checkpointing,
    } = settings;
    // Burn's tensors of one graph must share a checkpointing strategy, which a tensor takes
    // from the device it is made on: the model's parameters are made again on an autodiff
    // device with it (same ids, same values), and each step's graph is built on the model's.
    let burn_model = |model: Gpt| match checkpointing {
        true => model.map(&mut MadeOn(
            device.clone().autodiff().gradient_checkpointing(),
        )),
        false => model,
    };
    Ok(match kind {
        EngineKind::Autodiff => Box::new(autodiff::AutodiffEngine::new(
            burn_model(model),
            optimizer,
            device,
            threads,
            dtype,
            ranks.cloned(),
        )),
        EngineKind::Device => Box::new(device::DeviceEngine::new(
            burn_model(model),
            optimizer,
            device,
            threads,
            dtype,
            ranks.cloned(),
        )?),
        EngineKind::Fused => Box::new(fused::FusedEngine::new(
            model,
            optimizer,
            threads,
            checkpointing,
            ranks.cloned(),
        )?),
    })
}
