//! [`HostEngine`]: Burn's autodiff and Burn's AdamW on a CPU backend (flex, ndarray).

use anyhow::{Context, Result};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor};
use tinygpt_model::Gpt;

use super::burn_step::{Precision, clip_global_norm, gradients, losses, read_steps};
use super::{Engine, LOST, Step};
use crate::backend::EngineKind;
use crate::config::TrainDType;
use crate::data::Batch;
use crate::train::optim::{Optimizer, UpdateRule, record_bytes};

/// `Gpt::forward`, the loss and `backward()` on a CPU device, then Burn's AdamW. A read back
/// costs no wait for another processor here, so each step's loss and norm are read at once to
/// decide whether to apply it.
pub(super) struct HostEngine {
    /// The model, on the autodiff form of `device`. `None` only while an update replaces it.
    model: Option<Gpt>,
    optim: ModuleOptimizer,
    /// The inner (non-autodiff) device.
    device: Device,
    /// Threads the loss estimates share batches among.
    threads: usize,
    precision: Precision,
    /// Outcomes of steps taken, not yet handed out.
    known: Vec<Step>,
}

impl HostEngine {
    pub fn new(
        model: Gpt,
        optimizer: Optimizer,
        device: Device,
        threads: usize,
        dtype: TrainDType,
    ) -> Self {
        // Burn's optimizer is the rule here.
        let optim = match optimizer.rule {
            UpdateRule::AdamW(_) => optimizer.burn,
        };
        Self {
            precision: Precision::new(dtype, &device),
            model: Some(model),
            optim,
            device,
            threads,
            known: Vec::new(),
        }
    }

    fn held(&self) -> Result<&Gpt> {
        self.model.as_ref().context(LOST)
    }
}

impl Engine for HostEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Autodiff
    }

    fn describe(&self) -> String {
        self.precision.describe("Burn autodiff")
    }

    fn model(&mut self) -> Result<&Gpt> {
        self.held()
    }

    fn optimizer_bytes(&mut self) -> Result<Vec<u8>> {
        record_bytes(&self.optim)
    }

    fn step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<()> {
        let model = self.model.as_ref().context(LOST)?;
        let precision = &mut self.precision;
        let (mut grads, loss, loss_scale) =
            gradients(model, batches, &self.device, dropout_seed, precision)?;
        let norm = clip_global_norm(model, &mut grads, grad_clip, loss_scale)
            .unwrap_or_else(|| Tensor::zeros([1], &self.device));
        let stats = Tensor::cat(vec![loss.inner(), norm], 0);
        if let Some(loss_scale) = &mut precision.loss_scale {
            loss_scale.update(stats.clone().is_finite().all());
        }
        let step = read_steps(stats)?[0];
        self.known.push(step);
        if step.applied {
            let model = self.model.take().context(LOST)?;
            self.model = Some(self.optim.step(lr, model, grads));
        }
        Ok(())
    }

    fn outcomes(&mut self, _wait: bool) -> Result<Vec<Step>> {
        Ok(std::mem::take(&mut self.known))
    }

    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        let model = self.held()?;
        losses(
            model,
            self.precision.dtype,
            &self.device,
            batches,
            self.threads,
        )
    }
}
