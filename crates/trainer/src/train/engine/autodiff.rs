//! [`AutodiffEngine`]: Burn's autodiff and Burn's optimizer (AdamW, or Muon beside it) on a CPU
//! backend (flex, ndarray), or on a GPU for an update the device engine does not implement.

use anyhow::Result;
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor};
use tinygpt_model::Gpt;

use super::burn_step::{BurnModel, clip_global_norm, read_steps};
use super::{Engine, Step};
use crate::backend::EngineKind;
use crate::config::TrainDType;
use crate::data::Batch;
use crate::distributed::Ranks;
use crate::train::optim::{Optimizer, UpdateRule, record_bytes};

/// `Gpt::forward`, the loss and `backward()`, then Burn's optimizer (AdamW, or Muon beside it).
/// On a CPU a read back costs no wait for another processor, so each step's loss and norm are
/// read at once to decide whether to apply it (on a GPU, where only Muon brings it, the same).
pub(super) struct AutodiffEngine {
    burn: BurnModel,
    optim: ModuleOptimizer,
    /// Outcomes of steps taken, not yet handed out.
    known: Vec<Step>,
    /// The ranks a step's micro-batches are dealt to, when there are several.
    ranks: Option<Ranks>,
}

impl AutodiffEngine {
    pub fn new(
        model: Gpt,
        optimizer: Optimizer,
        device: Device,
        threads: usize,
        dtype: TrainDType,
        ranks: Option<Ranks>,
    ) -> Self {
        // Burn's optimizer is the rule here.
        let optim = match optimizer.rule {
            UpdateRule::AdamW(_) | UpdateRule::Muon(..) => optimizer.burn,
        };
        Self {
            burn: BurnModel::new(model, device, threads, dtype),
            optim,
            known: Vec::new(),
            ranks,
        }
    }
}

impl Engine for AutodiffEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Autodiff
    }

    fn describe(&self) -> String {
        let engine = self.burn.precision.describe("Burn autodiff");
        match &self.ranks {
            Some(ranks) => format!("{engine}, {} ranks (MPI)", ranks.size()),
            None => engine,
        }
    }

    fn model(&mut self) -> Result<&Gpt> {
        self.burn.held()
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
        let ranks = self.ranks.as_ref();
        let (mut grads, loss, loss_scale) = self.burn.gradients(batches, dropout_seed, ranks)?;
        let norm = clip_global_norm(self.burn.held()?, &mut grads, grad_clip, loss_scale)
            .unwrap_or_else(|| Tensor::zeros([1], &self.burn.device));
        let stats = Tensor::cat(vec![loss.inner(), norm], 0);
        if let Some(loss_scale) = &mut self.burn.precision.loss_scale {
            loss_scale.update(stats.clone().is_finite().all());
        }
        let step = read_steps(stats)?[0];
        self.known.push(step);
        if step.applied {
            let model = self.burn.take()?;
            self.burn.model = Some(self.optim.step(lr, model, grads));
        }
        Ok(())
    }

    fn outcomes(&mut self, _wait: bool) -> Result<Vec<Step>> {
        Ok(std::mem::take(&mut self.known))
    }

    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        self.burn.losses(batches)
    }
}
