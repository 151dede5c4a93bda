//! Where a training step's loss and gradients come from: Burn's autodiff on the chosen backend,
//! or the model crate's fused CPU step ([`FusedCpu`]). Either way Burn's AdamW applies them.

use anyhow::Result;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor};
use tinygpt_model::{Decoder, FusedCpu, FusedDecoder, Gpt, TokenBatch, cross_entropy};

use crate::backend::Backend;
use crate::data::Batch;

/// Computes losses and gradients for [`train_step`](crate::train::train_step) and the loss
/// estimates.
pub enum Engine {
    /// `Gpt::forward`, `cross_entropy` and `backward()` on this device (without autodiff; the
    /// gradients are taken on its autodiff form).
    Autodiff(Device),
    /// Hand-written forward and backward on the CPU, the batch split over threads.
    Fused(Box<FusedCpu>),
}

impl Engine {
    /// The engine for `backend` (after [`Backend::resolve`]): fused for `Fused`, autodiff
    /// otherwise. An explicit `--backend fused` on a model the fused step does not cover is an
    /// error; `auto` falls back to autodiff on flex for it.
    pub fn new(
        backend: Backend,
        explicit: bool,
        device: &Device,
        model: &Gpt,
        threads: usize,
    ) -> Result<Self> {
        let autodiff = Self::Autodiff(device.clone().inner());
        if backend != Backend::Fused {
            return Ok(autodiff);
        }
        match FusedCpu::new(model, threads) {
            Ok(fused) => Ok(Self::Fused(Box::new(fused))),
            Err(e) if explicit => Err(e.into()),
            Err(_) => Ok(autodiff),
        }
    }

    /// A short description for the log line.
    pub fn describe(&self, threads: usize) -> String {
        match self {
            Self::Autodiff(_) => "Burn autodiff".into(),
            Self::Fused(_) => format!("fused CPU step on {threads} threads"),
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
            Self::Fused(fused) => {
                fused.read_weights(model);
                batches
                    .iter()
                    .map(|batch| Ok(fused.loss(token_batch(batch))?))
                    .collect()
            }
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
    ) -> Result<(GradientsParams, f64)> {
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
                Ok((grads, loss_sum.into_scalar::<f32>() as f64))
            }
            Self::Fused(fused) => {
                fused.read_weights(model);
                let mut loss = 0.0;
                for (k, batch) in batches.iter().enumerate() {
                    let seed = crate::data::mix(dropout_seed, k, 0);
                    loss += fused.accumulate(token_batch(batch), 1.0 / n as f32, Some(seed))? / n;
                }
                if grad_clip > 0.0 {
                    fused.clip_grad_norm(grad_clip);
                }
                Ok((fused.take_gradients(model), loss))
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
