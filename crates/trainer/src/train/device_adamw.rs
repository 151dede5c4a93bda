//! AdamW as tensor ops on the model's device, each update gated by a flag computed on that
//! device: the non-finite guard without a host wait per step.
//!
//! On a GPU, reading the loss and the gradient norm back every step (two floats) makes the host
//! wait for the device at every step, so the next step cannot be queued while this one runs.
//! Here the decision "is this step finite?" stays on the device: the update of every weight,
//! both moments and the step count is computed and then kept or dropped by a select on that
//! flag. A non-finite step changes nothing, exactly as the host-side guard promises, and the
//! flags are read when the loss is (at log intervals).
//!
//! The arithmetic is Burn's `AdamW` (moments, bias correction, decoupled weight decay), tested
//! equal to it; the state converts to and from Burn's record through [`MomentState`], as the
//! fused CPU engine's does, so checkpoints keep Burn's `optimizer.bpk` format.

use std::collections::HashMap;

use anyhow::{Context, Result};
use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Bool, Device, Tensor, TensorData};
use tinygpt_model::{AdamWSettings, Gpt, MomentState};

/// AdamW's state on the device; see the module docs.
pub struct DeviceAdamW {
    settings: AdamWSettings,
    /// Per parameter; absent until its first step.
    states: HashMap<ParamId, Moments>,
}

/// One parameter's state, flat: `[numel]` moments and `[1]` steps applied (f32: exact to 2^24).
#[derive(Clone)]
struct Moments {
    shape: Vec<usize>,
    moment_1: Tensor<1>,
    moment_2: Tensor<1>,
    time: Tensor<1>,
}

impl DeviceAdamW {
    /// AdamW with `settings`, holding `states` (Burn's record of it; empty before the first
    /// step) on `device`.
    pub fn new(settings: AdamWSettings, states: Vec<MomentState>, device: &Device) -> Self {
        let states = states
            .into_iter()
            .map(|s| {
                let n = s.moment_1.len();
                let moments = Moments {
                    moment_1: Tensor::from_data(TensorData::new(s.moment_1, [n]), device),
                    moment_2: Tensor::from_data(TensorData::new(s.moment_2, [n]), device),
                    time: Tensor::from_data(TensorData::new(vec![s.time as f32], [1]), device),
                    shape: s.shape,
                };
                (s.id, moments)
            })
            .collect();
        Self { settings, states }
    }

    /// One AdamW step of `model` along `grads` at learning rate `lr`, applied where `finite`
    /// (`[1]`, on the device) is true and dropped where it is false, with nothing read back.
    pub fn step(
        &mut self,
        model: Gpt,
        grads: GradientsParams,
        lr: f64,
        finite: Tensor<1, Bool>,
    ) -> Gpt {
        let mut update = Update {
            adamw: self,
            grads,
            lr,
            keep: finite.bool_not(),
        };
        model.map(&mut update)
    }

    /// The state as Burn records it (read back from the device: for checkpoints only).
    pub fn moment_states(&self) -> Result<Vec<MomentState>> {
        let read = |t: &Tensor<1>| -> Result<Vec<f32>> {
            t.clone()
                .into_data()
                .try_to_vec::<f32>()
                .map_err(|e| anyhow::anyhow!("optimizer state: {e:?}"))
        };
        let mut states = Vec::with_capacity(self.states.len());
        for (id, m) in &self.states {
            let time = read(&m.time)?
                .first()
                .copied()
                .context("an empty step count")?;
            states.push(MomentState {
                id: *id,
                shape: m.shape.clone(),
                time: time as usize,
                moment_1: read(&m.moment_1)?,
                moment_2: read(&m.moment_2)?,
            });
        }
        states.sort_by_key(|s| s.id.val());
        Ok(states)
    }

    /// Burn's `AdamW::step` on one flat parameter `p` (`[n]`) with gradient `g`, the new values
    /// selected against the old ones by `keep` (`[1]`, true = keep the old).
    fn update(
        &mut self,
        id: ParamId,
        shape: &[usize],
        p: Tensor<1>,
        g: Tensor<1>,
        lr: f64,
        keep: &Tensor<1, Bool>,
    ) -> Tensor<1> {
        let s = &self.settings;
        let [n] = p.dims();
        let old = self.states.remove(&id).unwrap_or_else(|| {
            // Burn's first step (moments from the gradient alone) is this step from zeros.
            let device = p.device();
            Moments {
                shape: shape.to_vec(),
                moment_1: Tensor::zeros([n], &device),
                moment_2: Tensor::zeros([n], &device),
                time: Tensor::zeros([1], &device),
            }
        });
        let moment_1 =
            old.moment_1.clone().mul_scalar(s.beta_1) + g.clone().mul_scalar(1.0 - s.beta_1);
        let moment_2 =
            old.moment_2.clone().mul_scalar(s.beta_2) + g.square().mul_scalar(1.0 - s.beta_2);
        let time = old.time.clone().add_scalar(1.0);
        // 1 - β^t with t on the device: Burn computes `1 - β.powi(t)` on the host.
        let correction = |beta: f32| {
            Tensor::<1>::full([1], beta, &time.device())
                .powf(time.clone())
                .neg()
                .add_scalar(1.0)
        };
        let m_hat = moment_1.clone() / correction(s.beta_1);
        let v_hat = moment_2.clone() / correction(s.beta_2);
        let delta = m_hat / v_hat.sqrt().add_scalar(s.epsilon);
        let decay = match self.settings.decayed.contains(&id) {
            true => lr * f64::from(self.settings.weight_decay),
            false => 0.0,
        };
        let decayed = match decay {
            0.0 => p.clone(),
            d => p.clone().mul_scalar(1.0 - d),
        };
        let updated = decayed - delta.mul_scalar(lr);
        let keep_n = keep.clone().expand([n]);
        self.states.insert(
            id,
            Moments {
                shape: shape.to_vec(),
                moment_1: moment_1.mask_where(keep_n.clone(), old.moment_1),
                moment_2: moment_2.mask_where(keep_n.clone(), old.moment_2),
                time: time.mask_where(keep.clone(), old.time),
            },
        );
        updated.mask_where(keep_n, p)
    }
}

/// Maps every parameter of the model through [`DeviceAdamW::update`].
struct Update<'a> {
    adamw: &'a mut DeviceAdamW,
    grads: GradientsParams,
    lr: f64,
    keep: Tensor<1, Bool>,
}

impl ModuleMapper for Update<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let shape = tensor.shape();
        let dims: Vec<usize> = shape.iter().copied().collect();
        let n: usize = dims.iter().product();
        // The update runs off the autodiff graph; the new leaf is marked as the old one was.
        let require_grad = tensor.is_require_grad();
        let checkpointing = tensor.gradient_checkpointing_strategy();
        let p = tensor.inner().reshape([n]);
        let g = grad.inner().reshape([n]);
        let updated = self.adamw.update(id, &dims, p, g, self.lr, &self.keep);
        let mut tensor = Tensor::from_inner(updated.reshape(shape));
        if let Some(strategy) = checkpointing {
            tensor = tensor.with_gradient_checkpointing_strategy(strategy);
        }
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}
