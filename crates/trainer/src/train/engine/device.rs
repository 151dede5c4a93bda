//! [`DeviceEngine`]: Burn's autodiff on a GPU, then [`DeviceAdamW`], which applies the update
//! only where the loss and the norm are finite, deciding on the device.

use anyhow::{Context, Result};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor, TensorData};
use tinygpt_model::{Gpt, LrRatios, gpu::sum_all};

use super::burn_step::{BurnModel, clip_scale, read_steps};
use super::{Engine, Step};
use crate::backend::EngineKind;
use crate::config::TrainDType;
use crate::data::Batch;
use crate::distributed::Ranks;
use crate::train::device_adamw::DeviceAdamW;
use crate::train::optim::{
    Optimizer, UpdateRule, burn_from_moments, moments_from_burn, record_bytes,
};

/// Steps whose outcome the engine keeps on the device before it reads them anyway: a bound on
/// what a caller that never asks can pile up.
const MAX_PENDING: usize = 1024;

/// See the module docs. Nothing is read back during a step: the global norm is one reduction
/// over the flat gradients, the clipping and loss-scale factor are folded into AdamW's kernel,
/// and each step's `[loss, norm]` waits on the device until [`Engine::outcomes`] asks.
pub(super) struct DeviceEngine {
    burn: BurnModel,
    /// The run's optimizer: the groups and settings its record is written with.
    template: ModuleOptimizer,
    adamw: Box<DeviceAdamW>,
    /// Each step's `[loss, gradient norm]`, still on the device.
    pending: Vec<Tensor<1>>,
    /// Outcomes read back, not yet handed out.
    known: Vec<Step>,
    /// The ranks the gradients are added up over (through the host), when there are several.
    ranks: Option<Ranks>,
}

impl DeviceEngine {
    pub fn new(
        model: Gpt,
        optimizer: Optimizer,
        device: Device,
        threads: usize,
        dtype: TrainDType,
        ranks: Option<Ranks>,
    ) -> Result<Self> {
        let optim = optimizer.burn;
        let states = moments_from_burn(&optim).context("optimizer state")?;
        let adamw = match optimizer.rule {
            UpdateRule::AdamW(settings) if settings.lr_ratios != LrRatios::default() => {
                anyhow::bail!(
                    "the device engine's AdamW updates every parameter at one rate; groups of \
                     their own train through Burn's optimizer"
                )
            }
            UpdateRule::AdamW(settings) => DeviceAdamW::new(settings, states, &model, &device),
            UpdateRule::Muon(..) => anyhow::bail!(
                "the device engine updates with AdamW only; Muon trains through Burn's optimizer"
            ),
        };
        let adamw = adamw.context("optimizer state")?;
        Ok(Self {
            burn: BurnModel::new(model, device, threads, dtype),
            template: optim,
            adamw: Box::new(adamw),
            pending: Vec::new(),
            known: Vec::new(),
            ranks,
        })
    }

    fn read_pending(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            let steps = read_steps(Tensor::cat(std::mem::take(&mut self.pending), 0))?;
            self.known.extend(steps);
        }
        Ok(())
    }
}

impl Engine for DeviceEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Device
    }

    fn describe(&self) -> String {
        let engine = self
            .burn
            .precision
            .describe("Burn autodiff, AdamW on the device");
        match &self.ranks {
            Some(ranks) => format!("{engine}, {} ranks (MPI, through the host)", ranks.size()),
            None => engine,
        }
    }

    fn model(&mut self) -> Result<&Gpt> {
        self.burn.held()
    }

    fn optimizer_bytes(&mut self) -> Result<Vec<u8>> {
        record_bytes(&burn_from_moments(
            &self.template,
            self.adamw.moment_states()?,
        )?)
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
        let flat = self.adamw.flatten(&mut grads);
        let squares = sum_all(flat.clone().square());
        let squares = match ranks {
            Some(ranks) => as_rank_zero(ranks, squares)?,
            None => squares,
        };
        let (norm, scale) = clip_scale(squares, grad_clip, loss_scale);
        let stats = Tensor::cat(vec![loss.inner(), norm], 0);
        let finite = stats.clone().is_finite().all();
        if let Some(loss_scale) = &mut self.burn.precision.loss_scale {
            loss_scale.update(finite.clone());
        }
        let scale = scale.unwrap_or_else(|| Tensor::ones([1], &stats.device()));
        self.pending.push(stats);
        let model = self.burn.take()?;
        self.burn.model = Some(self.adamw.step(model, flat, lr, scale, finite));
        if self.pending.len() >= MAX_PENDING {
            self.read_pending()?;
        }
        Ok(())
    }

    fn outcomes(&mut self, wait: bool) -> Result<Vec<Step>> {
        if wait {
            self.read_pending()?;
        }
        Ok(std::mem::take(&mut self.known))
    }

    fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        self.burn.losses(batches)
    }
}

/// Rank 0's value of the one-value tensor `value` on every rank. Burn picks a reduction's
/// kernel by timing it on each device, so two ranks may add the same summed gradients' squares
/// in different orders; the clipping factor from them must be one for all, or the ranks'
/// weights part (a two-rank run on lavapipe stopped so, its CPUs busy with other work).
fn as_rank_zero(ranks: &Ranks, value: Tensor<1>) -> Result<Tensor<1>> {
    let (device, dtype) = (value.device(), value.dtype());
    let values = value.into_data().convert::<f32>().try_into_vec::<f32>();
    let values = values.map_err(|e| anyhow::anyhow!("the gradients' norm: {e:?}"))?;
    let mut bytes = values
        .first()
        .copied()
        .unwrap_or(0.0)
        .to_le_bytes()
        .to_vec();
    ranks.broadcast(&mut bytes);
    let zeros: [u8; 4] = bytes
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .context("rank 0 sent no gradients' norm")?;
    let value = f32::from_le_bytes(zeros);
    let tensor: Tensor<1> = Tensor::from_data(TensorData::new(vec![value], [1]), &device);
    Ok(tensor.cast(dtype))
}
