//! AdamW on the model's device over flat buffers: every parameter, its two moments and its
//! gradient end to end in one `[n]` tensor each, updated by one kernel launch on a GPU, each
//! update gated by a flag computed on that device (the non-finite guard without a host wait).
//!
//! On a GPU, reading the loss and the gradient norm back every step makes the host wait for
//! the device at every step, so the next step cannot be queued while this one runs. Here the
//! decision "is this step finite?" stays on the device: the kernel writes every weight and
//! moment back unchanged, and the step count does not advance, when the flag is false. The
//! flags are read when the loss is (at log intervals).
//!
//! The flat layout is what makes one launch possible: the gradients are gathered into one
//! buffer (which also gives the global norm in one reduction), the kernel updates all of it,
//! and the model's parameters become views of the new buffer. It is the model's
//! [`ParamLayout`], the parameter table's order, which the fused CPU engine's AdamW walks too. On a backend without the kernel
//! (the CPU ones, where the engine tests run) the same arithmetic runs as tensor ops on the
//! same buffers. Either way it is Burn's `AdamW` (moments, bias correction, decoupled weight
//! decay), tested equal to it; the state converts to and from Burn's record through
//! [`MomentState`], so checkpoints keep Burn's `optimizer.bpk` format.

use anyhow::{Result, bail};
use burn::module::{Module, ModuleMapper, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Bool, DType, Device, Tensor, TensorData};
use tinygpt_model::gpu::{AdamWBuffers, adamw, max_bindings};
use tinygpt_model::{AdamWSettings, Gpt, MomentState, ParamLayout};

/// Tensors per `cat` when the gradients are gathered in groups (see [`DeviceAdamW::flatten`]):
/// with the output, nine bindings, as many as the AdamW kernel's.
const CAT_GROUP: usize = 8;

/// AdamW's state on the device; see the module docs.
pub(crate) struct DeviceAdamW {
    settings: AdamWSettings,
    /// Where each parameter lives in the flat buffers.
    layout: ParamLayout,
    /// The weights, `[n]`: the model's parameters are views of it.
    params: Tensor<1>,
    moment_1: Tensor<1>,
    moment_2: Tensor<1>,
    /// `[n]`: 1 where weight decay applies (the matrices), else 0.
    decay: Tensor<1>,
    /// `[1]`: steps applied (f32: exact to 2^24).
    time: Tensor<1>,
    /// Whether the fused kernel runs here (a CubeCL device), else tensor ops.
    kernel: bool,
    /// The device's bindings a kernel ([`max_bindings`]), read once: `None` off CubeCL.
    max_bindings: Option<u32>,
}

impl DeviceAdamW {
    /// AdamW with `settings` for `model`'s parameters (on `device`), holding `states` (Burn's
    /// record of it; empty before the first step). Every parameter's state must be there, or
    /// none (they step together).
    pub fn new(
        settings: AdamWSettings,
        states: Vec<MomentState>,
        model: &Gpt,
        device: &Device,
    ) -> Result<Self> {
        let layout = ParamLayout::of(model);
        let n = layout.len();
        let states = layout
            .gather(states)
            .map_err(|e| anyhow::anyhow!("the optimizer state does not fit this model: {e}"))?;
        if states.windows(2).any(|pair| pair[0].time != pair[1].time) {
            bail!("the optimizer state's parameters were stepped unequally");
        }
        let time = states.first().map(|s| s.time);
        let mut moment_1 = vec![0.0; n];
        let mut moment_2 = vec![0.0; n];
        for (entry, state) in layout.entries().iter().zip(&states) {
            moment_1[entry.range()].copy_from_slice(&state.moment_1);
            moment_2[entry.range()].copy_from_slice(&state.moment_2);
        }
        let mut decay = vec![0.0; n];
        for entry in layout.entries() {
            if settings.decayed.contains(&entry.id) {
                decay[entry.range()].fill(1.0);
            }
        }
        let flat = |values: Vec<f32>| Tensor::<1>::from_data(TensorData::new(values, [n]), device);
        let time = vec![time.unwrap_or(0) as f32];
        Ok(Self {
            settings,
            params: layout.flatten(model),
            moment_1: flat(moment_1),
            moment_2: flat(moment_2),
            decay: flat(decay),
            time: Tensor::from_data(TensorData::new(time, [1]), device),
            kernel: model.kernels().fuse(DType::F32),
            max_bindings: max_bindings(device),
            layout,
        })
    }

    /// The gradients `grads` holds, end to end in the parameters' order, `[n]` (zeros for a
    /// parameter without one).
    ///
    /// Burn's fusion writes a `cat` as one element-wise kernel only when its tensors fit a
    /// kernel's bindings ([`max_bindings`]); past that it copies each tensor with a launch of
    /// its own, 52 for the baby model on lavapipe. So on a device where they do not fit, the
    /// gradients are gathered in `cat`s of [`CAT_GROUP`], then those, until one `cat` fits:
    /// 250 → 203 launches per baby step on lavapipe. Where they fit (CUDA's 1,024 bindings),
    /// one `cat`, as before.
    pub fn flatten(&self, grads: &mut GradientsParams) -> Tensor<1> {
        let device = self.params.device();
        let entries = self.layout.entries();
        let mut parts: Vec<Tensor<1>> = entries
            .iter()
            .map(|entry| match entry.shape.len() {
                1 => grads.remove::<1>(entry.id),
                2 => grads.remove::<2>(entry.id).map(|g| g.reshape([entry.len])),
                _ => None,
            })
            .zip(entries)
            .map(|(grad, entry)| grad.unwrap_or_else(|| Tensor::zeros([entry.len], &device)))
            .collect();
        let most = self.max_bindings;
        let fits =
            |count: usize| most.is_none_or(|most| count < most as usize) || count <= CAT_GROUP;
        while !fits(parts.len()) {
            parts = parts
                .chunks(CAT_GROUP)
                .map(|chunk| Tensor::cat(chunk.to_vec(), 0))
                .collect();
        }
        Tensor::cat(parts, 0)
    }

    /// One AdamW step of `model` along the flat gradients `grads` times `scale` (`[1]`: the
    /// clipping and loss-scale factor), at learning rate `lr`, applied where `finite` (`[1]`,
    /// on the device) is true and dropped where it is false, with nothing read back.
    pub fn step(
        &mut self,
        model: Gpt,
        grads: Tensor<1>,
        lr: f64,
        scale: Tensor<1>,
        finite: Tensor<1, Bool>,
    ) -> Gpt {
        let keep = finite.clone().float();
        let time = self.time.clone() + keep.clone();
        let buffers = AdamWBuffers {
            params: self.params.clone(),
            moment_1: self.moment_1.clone(),
            moment_2: self.moment_2.clone(),
        };
        let step = Tensor::cat(vec![scale, time.clone(), keep], 0);
        let updated = match self.kernel {
            true => adamw(buffers, grads, self.decay.clone(), step, lr, &self.settings),
            false => adamw_ops(buffers, grads, self.decay.clone(), step, lr, &self.settings),
        };
        self.params = updated.params;
        self.moment_1 = updated.moment_1;
        self.moment_2 = updated.moment_2;
        self.time = time;
        model.map(&mut Views {
            layout: &self.layout,
            params: &self.params,
        })
    }

    /// The state as Burn records it (read back from the device: for checkpoints only).
    pub(crate) fn moment_states(&self) -> Result<Vec<MomentState>> {
        let read = |t: &Tensor<1>| -> Result<Vec<f32>> {
            t.clone()
                .into_data()
                .try_to_vec::<f32>()
                .map_err(|e| anyhow::anyhow!("optimizer state: {e:?}"))
        };
        let (moment_1, moment_2) = (read(&self.moment_1)?, read(&self.moment_2)?);
        let time = read(&self.time)?.first().copied().unwrap_or(0.0) as usize;
        // Burn's record has no state before a parameter's first step: `split` gives none.
        Ok(self.layout.split(&moment_1, &moment_2, time))
    }
}

/// Replaces each parameter by its view of the flat weights.
struct Views<'a> {
    layout: &'a ParamLayout,
    params: &'a Tensor<1>,
}

impl ModuleMapper for Views<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(entry) = self.layout.find(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        // The update runs off the autodiff graph; the new leaf is marked as the old one was.
        let require_grad = tensor.is_require_grad();
        let checkpointing = tensor.gradient_checkpointing_strategy();
        let view = self
            .params
            .clone()
            .slice(entry.range())
            .reshape(tensor.shape());
        let mut tensor = Tensor::from_inner(view);
        if let Some(strategy) = checkpointing {
            tensor = tensor.with_gradient_checkpointing_strategy(strategy);
        }
        if require_grad {
            tensor = tensor.require_grad();
        }
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// [`adamw`]'s arithmetic as tensor ops, for backends without the kernel.
fn adamw_ops(
    buffers: AdamWBuffers,
    grads: Tensor<1>,
    decay: Tensor<1>,
    step: Tensor<1>,
    lr: f64,
    s: &AdamWSettings,
) -> AdamWBuffers {
    let [n] = grads.dims();
    let at = |i: usize| step.clone().slice(i..i + 1);
    let (scale, time, keep) = (at(0), at(1), at(2).equal_elem(0.0));
    let g = grads * scale.expand([n]);
    let m = buffers.moment_1.clone().mul_scalar(s.beta_1) + g.clone().mul_scalar(1.0 - s.beta_1);
    let v = buffers.moment_2.clone().mul_scalar(s.beta_2) + g.square().mul_scalar(1.0 - s.beta_2);
    // 1 - β^t with t on the device.
    let correction = |beta: f32| {
        Tensor::<1>::full([1], beta, &time.device())
            .powf(time.clone())
            .neg()
            .add_scalar(1.0)
            .expand([n])
    };
    let m_hat = m.clone() / correction(s.beta_1);
    let v_hat = v.clone() / correction(s.beta_2);
    let delta = m_hat / v_hat.sqrt().add_scalar(s.epsilon);
    let decayed = buffers.params.clone()
        * decay
            .mul_scalar(-lr * f64::from(s.weight_decay))
            .add_scalar(1.0);
    let params = decayed - delta.mul_scalar(lr);
    let keep = keep.expand([n]);
    AdamWBuffers {
        params: params.mask_where(keep.clone(), buffers.params),
        moment_1: m.mask_where(keep.clone(), buffers.moment_1),
        moment_2: v.mask_where(keep, buffers.moment_2),
    }
}
