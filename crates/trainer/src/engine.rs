//! Where a training step's loss, gradients and update come from: Burn's autodiff and Burn's
//! AdamW on the chosen backend, or the model crate's fused CPU step ([`FusedCpu`]), which keeps
//! the weights and AdamW's moments in its own buffers and hands them to Burn (the model and a
//! Burn optimizer state) only when asked: for checkpoints and sampling.

use anyhow::{Context, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Bytes, Device, Tensor, TensorData};
use tinygpt_model::{
    AdamWSettings, Decoder, FusedCpu, FusedDecoder, Gpt, MomentState, TokenBatch, cross_entropy,
};

use crate::backend::Backend;
use crate::data::Batch;

/// Computes losses and gradients for [`train_step`](crate::train::train_step) and the loss
/// estimates, and applies the update.
pub enum Engine {
    /// `Gpt::forward`, `cross_entropy` and `backward()` on this device (without autodiff; the
    /// gradients are taken on its autodiff form), then Burn's AdamW.
    Autodiff(Device),
    /// Hand-written forward and backward on the CPU, the batch split over threads, and AdamW on
    /// the same buffers. The [`Gpt`] and the Burn optimizer passed around are brought up to date
    /// by [`Engine::sync`].
    Fused {
        fused: Box<FusedCpu>,
        adamw: AdamWSettings,
        /// Whether the weights changed since the last [`Engine::sync`].
        stale: bool,
    },
}

/// What [`Engine::gradients`] produced: Burn gradients for Burn's optimizer, or gradients the
/// fused engine holds in its buffers.
pub enum Gradients {
    Burn(GradientsParams),
    Held,
}

impl Engine {
    /// The engine for `backend` (after [`Backend::resolve`]): fused for `Fused`, autodiff
    /// otherwise. An explicit `--backend fused` on a model the fused step does not cover is an
    /// error; `auto` falls back to autodiff on flex for it. The fused engine starts from
    /// `model`'s weights and `optim`'s state (AdamW with `adamw`'s settings).
    pub fn new(
        backend: Backend,
        explicit: bool,
        device: &Device,
        (model, optim): (&Gpt, &ModuleOptimizer),
        adamw: AdamWSettings,
        threads: usize,
    ) -> Result<Self> {
        let autodiff = Self::Autodiff(device.clone().inner());
        if backend != Backend::Fused {
            return Ok(autodiff);
        }
        let mut fused = match FusedCpu::new(model, threads) {
            Ok(fused) => fused,
            Err(e) if explicit => return Err(e.into()),
            Err(_) => return Ok(autodiff),
        };
        fused
            .load_adamw_state(moments_from_burn(optim)?)
            .context("optimizer state")?;
        Ok(Self::Fused {
            fused: Box::new(fused),
            adamw,
            stale: false,
        })
    }

    /// Brings `model` and `optim` up to date with the fused engine's weights and AdamW state
    /// (nothing to do for autodiff, which updates them itself).
    pub fn sync(&mut self, model: Gpt, optim: &mut ModuleOptimizer) -> Result<Gpt> {
        match self {
            Self::Fused { fused, stale, .. } if *stale => {
                *optim = burn_from_moments(optim, fused.adamw_state())?;
                *stale = false;
                Ok(fused.write_weights(model))
            }
            _ => Ok(model),
        }
    }

    /// One optimizer step along `grads` at learning rate `lr`; returns the updated model (for
    /// the fused engine, `model` itself: its weights are updated in place, see [`Engine::sync`]).
    pub fn apply(
        &mut self,
        model: Gpt,
        optim: &mut ModuleOptimizer,
        grads: Gradients,
        lr: f64,
    ) -> Gpt {
        match (self, grads) {
            (
                Self::Fused {
                    fused,
                    adamw,
                    stale,
                },
                Gradients::Held,
            ) => {
                fused.adamw_step(lr, adamw);
                *stale = true;
                model
            }
            (_, Gradients::Burn(grads)) => optim.step(lr, model, grads),
            (Self::Autodiff(_), Gradients::Held) => unreachable!("autodiff never holds gradients"),
        }
    }

    /// A short description for the log line.
    pub fn describe(&self, threads: usize) -> String {
        match self {
            Self::Autodiff(_) => "Burn autodiff".into(),
            Self::Fused { .. } => format!("fused CPU step and AdamW on {threads} threads"),
        }
    }

    /// Mean loss of each batch in `batches` under `model` (no gradients, no dropout).
    /// `workers`: threads for the autodiff engine (the fused one splits every batch itself).
    pub fn losses(&mut self, model: &Gpt, batches: &[Batch], workers: usize) -> Result<Vec<f64>> {
        match self {
            Self::Autodiff(device) => parallel(batches, workers, |batch| {
                batch_loss(model, batch, device).map(|loss| loss.into_scalar::<f32>() as f64)
            })
            .into_iter()
            .collect(),
            Self::Fused { fused, .. } => batches
                .iter()
                .map(|batch| Ok(fused.loss(token_batch(batch))?))
                .collect(),
        }
    }

    /// Gradients of the mean loss over `batches` (each batch's loss weighted equally, as
    /// gradient accumulation does) and that mean loss, clipped to the global norm `grad_clip`
    /// (0 = no clipping). The autodiff engine seeds its device's generator with
    /// `dropout_seed`; the fused one derives each sequence's masks from it.
    pub fn gradients(
        &mut self,
        model: &Gpt,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
    ) -> Result<(Gradients, f64)> {
        let n = batches.len() as f64;
        match self {
            Self::Autodiff(device) => {
                let device = &device.clone().autodiff();
                device.seed(dropout_seed);
                let mut accumulator = GradientsAccumulator::new();
                let mut loss_sum = Tensor::<1>::zeros([1], device);
                for batch in batches {
                    // One thread: Burn's autodiff shares parameter leaf nodes between graphs,
                    // and two backward passes running at once panic ("graph tape has already
                    // been consumed").
                    let loss = batch_loss(model, batch, device)? / n;
                    let grads = GradientsParams::from_grads(loss.backward(), model);
                    loss_sum = loss_sum + loss.detach();
                    accumulator.accumulate(model, grads);
                }
                let mut grads = accumulator.grads();
                if grad_clip > 0.0 {
                    clip_global_norm(model, &mut grads, grad_clip);
                }
                Ok((Gradients::Burn(grads), loss_sum.into_scalar::<f32>() as f64))
            }
            Self::Fused { fused, .. } => {
                let mut loss = 0.0;
                for (k, batch) in batches.iter().enumerate() {
                    let seed = crate::data::mix(dropout_seed, k, 0);
                    loss += fused.accumulate(token_batch(batch), 1.0 / n as f32, Some(seed))? / n;
                }
                if grad_clip > 0.0 {
                    fused.clip_grad_norm(grad_clip);
                }
                Ok((Gradients::Held, loss))
            }
        }
    }
}

/// The decoder that samples from `model`: the fused CPU decoder for `Fused` (an explicit
/// `--backend fused` on a model it does not cover is an error, as in [`Engine::new`]), Burn on
/// the model's device otherwise.
pub fn decoder<'a>(
    backend: Backend,
    explicit: bool,
    model: &'a Gpt,
) -> Result<Box<dyn Decoder + 'a>> {
    if backend == Backend::Fused {
        match FusedDecoder::new(model) {
            Ok(decoder) => return Ok(Box::new(decoder)),
            Err(e) if explicit => return Err(e.into()),
            Err(_) => {}
        }
    }
    Ok(Box::new(model.decoder()))
}

fn token_batch(batch: &Batch) -> TokenBatch<'_> {
    TokenBatch {
        inputs: &batch.inputs,
        targets: &batch.targets,
        batch: batch.batch,
        seq: batch.seq,
    }
}

/// Mean next-token loss of a batch through Burn.
fn batch_loss(model: &Gpt, batch: &Batch, device: &Device) -> Result<Tensor<1>> {
    let (inputs, targets) = batch.to_device(device);
    let logits = model.forward(inputs)?;
    let [b, s, v] = logits.dims();
    Ok(cross_entropy(logits.reshape([b * s, v]), targets)?)
}

/// `f` over `items` on up to `workers` scoped threads, each taking a contiguous share; results
/// in item order. One worker runs inline.
fn parallel<T: Sync, R: Send>(items: &[T], workers: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if workers <= 1 || items.len() <= 1 {
        return items.iter().map(f).collect();
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(items.len().div_ceil(workers))
            .map(|chunk| scope.spawn(move || chunk.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// Scales every gradient by `min(1, max_norm / (‖g‖ + 1e-6))`, where ‖g‖ is the norm of all
/// gradients together (PyTorch's `clip_grad_norm_`). Burn's own clipping works per tensor.
fn clip_global_norm(model: &Gpt, grads: &mut GradientsParams, max_norm: f64) {
    struct SquaredNorms<'a>(&'a GradientsParams, Vec<Tensor<1>>);
    impl ModuleVisitor for SquaredNorms<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.get::<D>(param.id) {
                self.1.push(g.square().sum());
            }
        }
    }
    struct Scale<'a>(&'a mut GradientsParams, f32);
    impl ModuleVisitor for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.remove::<D>(param.id) {
                self.0.register(param.id, g * self.1);
            }
        }
    }
    let mut norms = SquaredNorms(grads, Vec::new());
    model.visit(&mut norms);
    if norms.1.is_empty() {
        return;
    }
    // One host read per step for the whole norm.
    let norm = Tensor::cat(norms.1, 0).sum().sqrt().into_scalar::<f32>() as f64;
    let scale = max_norm / (norm + 1e-6);
    if scale < 1.0 {
        model.visit(&mut Scale(grads, scale as f32));
    }
}

/// AdamW's state in `optim` (Burn's, e.g. loaded from a checkpoint), read from Burn's own
/// serialisation: for each parameter `{id}.momentum.moment_1`, `.moment_2` and the scalar
/// `{id}.momentum.time`. Empty before the first step.
fn moments_from_burn(optim: &ModuleOptimizer) -> Result<Vec<MomentState>> {
    let bytes = optim
        .into_bytes()
        .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
    let reader = burn_pack::Reader::from_bytes(bytes)?;
    let times = reader.scalars().clone();
    let mut moments: std::collections::BTreeMap<u64, MomentState> = Default::default();
    for tensor in reader.into_tensors()? {
        let (name, dtype, shape, param_id, bytes) = tensor.into_parts()?;
        let id = param_id.context("an optimizer tensor without a parameter id")?;
        let data = TensorData::from_bytes(bytes, shape, dtype);
        let shape = data.shape().to_vec();
        let values = data
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("optimizer tensor {name}: {e:?}"))?;
        let time = times
            .get(&format!("{id}.momentum.time"))
            .and_then(|t| usize::try_from(*t).ok())
            .with_context(|| format!("no step count for parameter {id}"))?;
        let state = moments.entry(id).or_insert_with(|| MomentState {
            id: ParamId::from(id),
            shape,
            time,
            moment_1: Vec::new(),
            moment_2: Vec::new(),
        });
        match name.rsplit('.').next() {
            Some("moment_1") => state.moment_1 = values,
            Some("moment_2") => state.moment_2 = values,
            _ => anyhow::bail!("unexpected optimizer tensor {name} (not AdamW's state)"),
        }
    }
    Ok(moments.into_values().collect())
}

/// `template` (the run's optimizer: its groups and settings) holding `states`, through Burn's
/// serialisation of AdamW's state, the names [`moments_from_burn`] reads.
fn burn_from_moments(
    template: &ModuleOptimizer,
    states: Vec<MomentState>,
) -> Result<ModuleOptimizer> {
    let mut tensors = Vec::new();
    let mut scalars = Vec::new();
    for state in states {
        let id = state.id.val();
        for (leaf, values) in [("moment_1", state.moment_1), ("moment_2", state.moment_2)] {
            let (bytes, shape, dtype) = TensorData::new(values, state.shape.clone()).into_parts();
            let name = format!("{id}.momentum.{leaf}");
            tensors.push(burn_pack::Tensor::new(name, dtype, shape, Some(id), bytes));
        }
        scalars.push((format!("{id}.__rank"), state.shape.len() as u64));
        scalars.push((format!("{id}.momentum.time"), state.time as u64));
    }
    let mut writer = burn_pack::Writer::new(tensors);
    for (key, value) in &scalars {
        writer = writer.with_scalar(key, burn_pack::Scalar::UInt(*value));
    }
    let bytes: Bytes = writer.into_bytes()?;
    template
        .clone()
        .from_bytes(bytes)
        .map_err(|e| anyhow::anyhow!("cannot load the optimizer state: {e:?}"))
}
