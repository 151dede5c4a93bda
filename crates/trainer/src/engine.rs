//! The training engine: it owns the model's weights and the optimizer's state, computes losses,
//! gradients and updates, and hands out an up-to-date [`Gpt`] (or checkpoint bytes) on request.
//!
//! Two engines sit behind one type: Burn's autodiff with Burn's AdamW on any device, and the
//! model crate's fused CPU engine ([`FusedCpu`]), which keeps the weights and AdamW's moments in
//! its own buffers and writes them into the [`Gpt`] and a Burn optimizer state only when they
//! are asked for. Either way the rest of the program cannot see stale weights.

use anyhow::{Context, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Tensor};
use tinygpt_model::{
    AdamWSettings, Decoder, FusedCpu, FusedDecoder, Gpt, ModelError, TokenBatch,
    cross_entropy_counted, fused_support,
};

use crate::backend::{EngineChoice, Placement};
use crate::data::{Batch, mix};
use crate::optim::{burn_from_moments, moments_from_burn};

/// Owns a model and its optimizer; see the module docs.
pub struct Engine {
    kind: Kind,
    /// The model, on the autodiff form of the placement's device. `None` only while a step
    /// replaces it.
    model: Option<Gpt>,
    optim: ModuleOptimizer,
    /// Threads of the fused engine, and of the autodiff engine's loss estimates.
    threads: usize,
}

enum Kind {
    /// `Gpt::forward`, the loss and `backward()` on this device (the inner one; gradients are
    /// taken on its autodiff form), then Burn's AdamW.
    Autodiff(Device),
    /// Hand-written forward, backward and AdamW on the CPU, the batch split over threads.
    Fused {
        fused: Box<FusedCpu>,
        adamw: AdamWSettings,
        /// Whether the buffers hold weights that `model` and `optim` do not have yet.
        stale: bool,
    },
}

/// What one optimizer step saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// The mean loss over the step's batches.
    pub loss: f64,
    /// The global gradient norm, before clipping.
    pub grad_norm: f64,
    /// Whether the update was applied: it is skipped when the loss or the norm is NaN or
    /// infinite, so one bad batch cannot poison the weights or AdamW's moments.
    pub applied: bool,
}

impl Engine {
    /// An engine for `model` (on the autodiff form of `placement`'s device) and `optim` (its
    /// AdamW, with `adamw`'s settings). Under [`EngineChoice::FusedIfSupported`] a model the
    /// fused engine does not implement trains on autodiff; the second value says why.
    pub fn new(
        placement: &Placement,
        model: Gpt,
        optim: ModuleOptimizer,
        adamw: AdamWSettings,
        threads: usize,
    ) -> Result<(Self, Option<String>)> {
        let autodiff = |model, optim| Self {
            kind: Kind::Autodiff(placement.device.clone()),
            model: Some(model),
            optim,
            threads,
        };
        match (placement.engine, fused_support(&model.config)) {
            (EngineChoice::Autodiff, _) => return Ok((autodiff(model, optim), None)),
            (EngineChoice::Fused, Err(e)) => return Err(e.into()),
            (EngineChoice::FusedIfSupported, Err(e)) => {
                let note = format!("{e}; training on flex");
                return Ok((autodiff(model, optim), Some(note)));
            }
            (EngineChoice::Fused | EngineChoice::FusedIfSupported, Ok(())) => {}
        }
        let mut fused = FusedCpu::new(&model, threads)?;
        fused
            .load_adamw_state(moments_from_burn(&optim)?)
            .context("optimizer state")?;
        let kind = Kind::Fused {
            fused: Box::new(fused),
            adamw,
            stale: false,
        };
        let engine = Self {
            kind,
            model: Some(model),
            optim,
            threads,
        };
        Ok((engine, None))
    }

    /// A short description for the log line.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Autodiff(_) => "Burn autodiff".into(),
            Kind::Fused { .. } => format!("fused CPU engine on {} threads", self.threads),
        }
    }

    /// The model with the latest weights.
    pub fn model(&mut self) -> Result<&Gpt> {
        self.sync()?;
        Ok(self.held())
    }

    /// The optimizer's state as Burn serialises it (`optimizer.bpk`), up to date.
    pub fn optimizer_bytes(&mut self) -> Result<Vec<u8>> {
        self.sync()?;
        let bytes = self
            .optim
            .into_bytes()
            .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
        Ok(bytes.to_vec())
    }

    /// One optimizer step: gradients of the mean loss over `batches` (each weighted equally, as
    /// gradient accumulation does), clipped to the global norm `grad_clip` (0 = no clipping),
    /// then AdamW at learning rate `lr`, unless the loss or the norm is not finite (see
    /// [`Step::applied`]). Dropout masks derive from `dropout_seed`. The loss and the norm are
    /// read back every step (two floats) to decide.
    pub fn step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<Step> {
        let n = batches.len() as f64;
        match &mut self.kind {
            Kind::Autodiff(device) => {
                let device = device.clone().autodiff();
                device.seed(dropout_seed);
                let model = self.model.take().context("the engine lost its model")?;
                let result = gradients(&model, batches, &device, grad_clip);
                let (grads, step) = match result {
                    Ok(done) => done,
                    Err(e) => {
                        self.model = Some(model);
                        return Err(e);
                    }
                };
                self.model = Some(match step.applied {
                    true => self.optim.step(lr, model, grads),
                    false => model,
                });
                Ok(step)
            }
            Kind::Fused {
                fused,
                adamw,
                stale,
            } => {
                let mut loss = 0.0;
                for (k, batch) in batches.iter().enumerate() {
                    let seed = mix(dropout_seed, k, 0);
                    loss += fused.accumulate(token_batch(batch), 1.0 / n as f32, Some(seed))? / n;
                }
                // An infinite bound measures the norm without scaling anything.
                let bound = if grad_clip > 0.0 {
                    grad_clip
                } else {
                    f64::INFINITY
                };
                let grad_norm = fused.clip_grad_norm(bound);
                let applied = loss.is_finite() && grad_norm.is_finite();
                if applied {
                    fused.adamw_step(lr, adamw);
                    *stale = true;
                } else {
                    fused.discard_gradients();
                }
                Ok(Step {
                    loss,
                    grad_norm,
                    applied,
                })
            }
        }
    }

    /// Mean loss of each batch under the current weights (no gradients, no dropout). The
    /// autodiff engine shares the batches among its threads; the fused one splits each batch.
    pub fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        let workers = self.threads;
        match &mut self.kind {
            Kind::Autodiff(device) => {
                let model = self.model.as_ref().context("the engine lost its model")?;
                let model = model.valid();
                let device = device.clone();
                let losses = parallel(batches, workers, |batch| batch_loss(&model, batch, &device))
                    .into_iter()
                    .collect::<Result<Vec<_>>>()?;
                if losses.is_empty() {
                    return Ok(Vec::new());
                }
                // One read back for all of them.
                let values = Tensor::cat(losses, 0).into_data().try_to_vec::<f32>();
                let values = values.map_err(|e| anyhow::anyhow!("losses: {e:?}"))?;
                Ok(values.into_iter().map(f64::from).collect())
            }
            Kind::Fused { fused, .. } => batches
                .iter()
                .map(|batch| Ok(fused.loss(token_batch(batch))?))
                .collect(),
        }
    }

    fn held(&self) -> &Gpt {
        self.model
            .as_ref()
            .expect("a step puts the model back before it returns")
    }

    /// Writes the fused engine's weights and moments into the model and Burn's optimizer.
    fn sync(&mut self) -> Result<()> {
        if let Kind::Fused { fused, stale, .. } = &mut self.kind
            && *stale
        {
            self.optim = burn_from_moments(&self.optim, fused.adamw_state())?;
            let model = self.model.take().context("the engine lost its model")?;
            self.model = Some(fused.write_weights(model));
            *stale = false;
        }
        Ok(())
    }
}

/// Gradients of the mean loss over `batches` through Burn's autodiff on `device`, clipped on
/// the device; the mean loss and the norm, read back together.
fn gradients(
    model: &Gpt,
    batches: &[Batch],
    device: &Device,
    grad_clip: f64,
) -> Result<(GradientsParams, Step)> {
    let n = batches.len() as f64;
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum = Tensor::<1>::zeros([1], device);
    for batch in batches {
        // One thread: Burn's autodiff shares parameter leaf nodes between graphs, and two
        // backward passes running at once panic ("graph tape has already been consumed").
        let loss = batch_loss(model, batch, device)? / n;
        let grads = GradientsParams::from_grads(loss.backward(), model);
        loss_sum = loss_sum + loss.detach();
        accumulator.accumulate(model, grads);
    }
    let mut grads = accumulator.grads();
    let norm = clip_global_norm(model, &mut grads, grad_clip);
    // The second read finds its value computed already: one wait per step.
    let loss = f64::from(loss_sum.into_scalar::<f32>());
    let grad_norm = norm.map_or(0.0, |n| f64::from(n.into_scalar::<f32>()));
    let step = Step {
        loss,
        grad_norm,
        applied: loss.is_finite() && grad_norm.is_finite(),
    };
    Ok((grads, step))
}

/// The decoder that samples from `model`: the fused CPU decoder when `engine` asks for the fused
/// engine and it implements the model (an explicit [`EngineChoice::Fused`] on one it does not is
/// an error), Burn on the model's device otherwise. A model whose vocabulary is padded past the
/// tokenizer's `tokens` ids only ever gives logits (and so samples) of real tokens.
pub fn decoder<'a>(
    engine: EngineChoice,
    model: &'a Gpt,
    tokens: usize,
) -> Result<Box<dyn Decoder + 'a>> {
    let supported = fused_support(&model.config);
    let inner: Box<dyn Decoder + 'a> = match (engine, supported) {
        (EngineChoice::Fused, Err(e)) => return Err(e.into()),
        (EngineChoice::Fused | EngineChoice::FusedIfSupported, Ok(())) => {
            Box::new(FusedDecoder::new(model)?)
        }
        _ => Box::new(model.decoder()),
    };
    Ok(match tokens < inner.vocab_size() {
        true => Box::new(Unpadded { inner, tokens }),
        false => inner,
    })
}

/// A decoder whose logits stop at the tokenizer's last id: a padded vocabulary's extra rows
/// are no tokens.
struct Unpadded<'a> {
    inner: Box<dyn Decoder + 'a>,
    tokens: usize,
}

impl Decoder for Unpadded<'_> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.tokens
    }
    fn cached(&self) -> usize {
        self.inner.cached()
    }
    fn clear(&mut self) {
        self.inner.clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut logits = self.inner.feed(tokens)?;
        logits.truncate(self.tokens);
        Ok(logits)
    }
}

fn token_batch(batch: &Batch) -> TokenBatch<'_> {
    TokenBatch {
        inputs: &batch.inputs,
        targets: &batch.targets,
        batch: batch.batch,
        seq: batch.seq,
    }
}

/// Mean next-token loss of a batch through Burn. The batch's ids and its count of kept targets
/// are checked on the host, so nothing is read back from the device.
pub fn batch_loss(model: &Gpt, batch: &Batch, device: &Device) -> Result<Tensor<1>> {
    model.check_tokens(&batch.inputs)?;
    let kept = batch.kept_targets()?;
    let (inputs, targets) = batch.to_device(device);
    let logits = model.forward(inputs)?;
    let [b, s, v] = logits.dims();
    Ok(cross_entropy_counted(
        logits.reshape([b * s, v]),
        targets,
        kept,
    )?)
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

/// The norm ‖g‖ of all gradients together, `[1]` on the device (`None` without gradients); with `max_norm > 0`, every
/// gradient is scaled by `min(1, max_norm / (‖g‖ + 1e-6))` (PyTorch's `clip_grad_norm_`; Burn's
/// own clipping works per tensor), the scale computed on the device.
fn clip_global_norm(model: &Gpt, grads: &mut GradientsParams, max_norm: f64) -> Option<Tensor<1>> {
    struct SquaredNorms<'a>(&'a GradientsParams, Vec<Tensor<1>>);
    impl ModuleVisitor for SquaredNorms<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.get::<D>(param.id) {
                self.1.push(g.square().sum());
            }
        }
    }
    struct Scale<'a>(&'a mut GradientsParams, Tensor<1>);
    impl ModuleVisitor for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.remove::<D>(param.id) {
                let scale = self.1.clone().reshape([1; D]);
                self.0.register(param.id, g * scale);
            }
        }
    }
    let mut norms = SquaredNorms(grads, Vec::new());
    model.visit(&mut norms);
    if norms.1.is_empty() {
        return None;
    }
    let norm = Tensor::cat(norms.1, 0).sum().sqrt();
    if max_norm > 0.0 {
        let scale = (norm.clone() + 1e-6)
            .recip()
            .mul_scalar(max_norm)
            .clamp_max(1.0);
        model.visit(&mut Scale(grads, scale));
    }
    Some(norm)
}
