//! The training engine: it owns the model's weights and the optimizer's state, computes losses,
//! gradients and updates, and hands out an up-to-date [`Gpt`] (or checkpoint bytes) on request.
//!
//! Three engines sit behind one type: Burn's autodiff with Burn's AdamW on the CPU; Burn's
//! autodiff with [`DeviceAdamW`] on a GPU, where the non-finite guard decides on the device and
//! a step's loss is read back only when asked for ([`Engine::outcomes`]); and the model crate's
//! fused CPU engine ([`FusedCpu`]), which keeps the weights and AdamW's moments in its own
//! buffers and writes them into the [`Gpt`] and a Burn optimizer state only when they are asked
//! for. Either way the rest of the program cannot see stale weights.

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, FloatDType, Tensor};
use tinygpt_model::{AdamWSettings, FusedCpu, Gpt, TokenBatch, cross_entropy_counted};

use crate::backend::{EngineKind, Placement};
use crate::config::TrainDType;
use crate::data::{Batch, mix};
use crate::train::device_adamw::DeviceAdamW;
use crate::train::loss_scale::LossScale;
use crate::train::optim::{burn_from_moments, moments_from_burn};

/// Owns a model and its optimizer; see the module docs.
pub struct Engine {
    kind: Kind,
    /// The model, on the autodiff form of the placement's device. `None` only while a step
    /// replaces it.
    model: Option<Gpt>,
    optim: ModuleOptimizer,
    /// Threads of the fused engine, and of the autodiff engine's loss estimates.
    threads: usize,
    /// Outcomes of steps taken, not yet handed out by [`Engine::outcomes`].
    known: Vec<Step>,
    /// What the Burn engines' steps compute in: f32, or a mixed precision (`train.dtype`).
    dtype: FloatDType,
    /// f16's loss scale; `None` in f32 and bf16.
    loss_scale: Option<LossScale>,
}

/// Steps whose outcome a GPU engine keeps on the device before it reads them anyway: a bound
/// on what a caller that never asks can pile up.
const MAX_PENDING: usize = 1024;

enum Kind {
    /// `Gpt::forward`, the loss and `backward()` on this device (the inner one; gradients are
    /// taken on its autodiff form), then Burn's AdamW.
    Autodiff(Device),
    /// The same gradients on a GPU, then [`DeviceAdamW`], which applies the update only where
    /// the loss and the norm are finite, deciding on the device.
    Device {
        device: Device,
        adamw: Box<DeviceAdamW>,
        /// Each step's `[loss, gradient norm]`, still on the device.
        pending: Vec<Tensor<1>>,
    },
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
    /// AdamW, with `adamw`'s settings), its steps computing in `dtype`, the one
    /// [`Placement::engine_for`] picks; the second value says why `auto` did not take the
    /// fused engine, when it did not.
    pub fn new(
        placement: &Placement,
        model: Gpt,
        optim: ModuleOptimizer,
        adamw: AdamWSettings,
        threads: usize,
        dtype: TrainDType,
    ) -> Result<(Self, Option<String>)> {
        let (decided, note) = placement.engine_for(&model.config, dtype)?;
        let device = placement.device.clone();
        let kind = match decided {
            EngineKind::Autodiff => Kind::Autodiff(device),
            EngineKind::Device => {
                let states = moments_from_burn(&optim).context("optimizer state")?;
                Kind::Device {
                    adamw: Box::new(
                        DeviceAdamW::new(adamw, states, &model, &device)
                            .context("optimizer state")?,
                    ),
                    device,
                    pending: Vec::new(),
                }
            }
            EngineKind::Fused => {
                let mut fused = FusedCpu::new(&model, threads)?;
                fused
                    .load_adamw_state(moments_from_burn(&optim)?)
                    .context("optimizer state")?;
                Kind::Fused {
                    fused: Box::new(fused),
                    adamw,
                    stale: false,
                }
            }
        };
        let engine = Self {
            kind,
            model: Some(model),
            optim,
            threads,
            known: Vec::new(),
            dtype: dtype.float(),
            loss_scale: (dtype == TrainDType::F16).then(|| LossScale::new(&placement.device)),
        };
        Ok((engine, note))
    }

    /// Which engine this is.
    pub fn kind(&self) -> EngineKind {
        match self.kind {
            Kind::Autodiff(_) => EngineKind::Autodiff,
            Kind::Device { .. } => EngineKind::Device,
            Kind::Fused { .. } => EngineKind::Fused,
        }
    }

    /// A short description for the log line.
    pub fn describe(&self) -> String {
        let engine = match &self.kind {
            Kind::Autodiff(_) => "Burn autodiff".into(),
            Kind::Device { .. } => "Burn autodiff, AdamW on the device".into(),
            Kind::Fused { .. } => format!("fused CPU engine on {} threads", self.threads),
        };
        match (self.dtype, &self.loss_scale) {
            (FloatDType::F32, _) => engine,
            (dtype, None) => format!("{engine}, {dtype:?} matmuls"),
            (dtype, Some(_)) => format!("{engine}, {dtype:?} matmuls with a loss scale"),
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
        let optim = match &self.kind {
            Kind::Device { adamw, .. } => burn_from_moments(&self.optim, adamw.moment_states()?)?,
            _ => self.optim.clone(),
        };
        let bytes = optim
            .into_bytes()
            .map_err(|e| anyhow::anyhow!("cannot serialise the optimizer state: {e:?}"))?;
        Ok(bytes.to_vec())
    }

    /// One optimizer step: gradients of the mean loss over `batches` (each weighted equally, as
    /// gradient accumulation does), clipped to the global norm `grad_clip` (0 = no clipping),
    /// then AdamW at learning rate `lr`, unless the loss or the norm is not finite (see
    /// [`Step::applied`]). Dropout masks derive from `dropout_seed`. What the step saw comes
    /// from [`Engine::outcomes`]: on the CPU the loss and the norm are read back at once (two
    /// floats) to decide; on a GPU the decision is made on the device and nothing is read.
    pub fn step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<()> {
        let device = match &self.kind {
            Kind::Fused { .. } => return self.fused_step(batches, dropout_seed, grad_clip, lr),
            Kind::Autodiff(device) | Kind::Device { device, .. } => device.clone().autodiff(),
        };
        let model = self.model.take().context("the engine lost its model")?;
        let precision = Precision {
            dtype: self.dtype,
            loss_scale: self.loss_scale.as_ref().map(LossScale::scale),
        };
        let (mut grads, loss) = match gradients(&model, batches, &device, dropout_seed, &precision)
        {
            Ok(done) => done,
            Err(e) => {
                self.model = Some(model);
                return Err(e);
            }
        };
        let loss_scale = precision.loss_scale;
        if let Kind::Device { .. } = self.kind {
            return self.device_update(model, grads, loss, grad_clip, lr, loss_scale);
        }
        let norm = clip_global_norm(&model, &mut grads, grad_clip, loss_scale)
            .unwrap_or_else(|| Tensor::zeros([1], &device.clone().inner()));
        let stats = Tensor::cat(vec![loss.inner(), norm], 0);
        if let Some(loss_scale) = &mut self.loss_scale {
            loss_scale.update(stats.clone().is_finite().all());
        }
        let step = match read_steps(stats) {
            Ok(steps) => steps[0],
            Err(e) => {
                self.model = Some(model);
                return Err(e);
            }
        };
        self.known.push(step);
        self.model = Some(match step.applied {
            true => self.optim.step(lr, model, grads),
            false => model,
        });
        Ok(())
    }

    /// The device engine's half of [`Engine::step`]: the global norm in one reduction over the
    /// flat gradients, the clipping and loss-scale factor folded into AdamW's kernel, the
    /// non-finite guard decided on the device; nothing is read back.
    fn device_update(
        &mut self,
        model: Gpt,
        mut grads: GradientsParams,
        loss: Tensor<1>,
        grad_clip: f64,
        lr: f64,
        loss_scale: Option<Tensor<1>>,
    ) -> Result<()> {
        let Kind::Device { adamw, pending, .. } = &mut self.kind else {
            bail!("the device update on another engine");
        };
        let flat = adamw.flatten(&mut grads);
        let squares = flat.clone().square().sum();
        let (norm, scale) = clip_scale(squares, grad_clip, loss_scale);
        let stats = Tensor::cat(vec![loss.inner(), norm], 0);
        let finite = stats.clone().is_finite().all();
        if let Some(loss_scale) = &mut self.loss_scale {
            loss_scale.update(finite.clone());
        }
        let scale = scale.unwrap_or_else(|| Tensor::ones([1], &stats.device()));
        pending.push(stats);
        self.model = Some(adamw.step(model, flat, lr, scale, finite));
        if pending.len() >= MAX_PENDING {
            self.read_pending()?;
        }
        Ok(())
    }

    /// [`Engine::step`] on the fused CPU engine's own buffers.
    fn fused_step(
        &mut self,
        batches: &[Batch],
        dropout_seed: u64,
        grad_clip: f64,
        lr: f64,
    ) -> Result<()> {
        let Kind::Fused {
            fused,
            adamw,
            stale,
        } = &mut self.kind
        else {
            bail!("the fused step on an autodiff engine");
        };
        let n = batches.len() as f64;
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
        let step = Step::new(loss, grad_norm);
        if step.applied {
            fused.adamw_step(lr, adamw);
            *stale = true;
        } else {
            fused.discard_gradients();
        }
        self.known.push(step);
        Ok(())
    }

    /// What the steps taken since the last call saw, in order. On a GPU their outcomes stay on
    /// the device until `wait` is set: then they are read in one transfer (which waits for the
    /// device to finish them); without it only outcomes already known come back (on the CPU,
    /// all of them).
    pub fn outcomes(&mut self, wait: bool) -> Result<Vec<Step>> {
        if wait {
            self.read_pending()?;
        }
        Ok(std::mem::take(&mut self.known))
    }

    fn read_pending(&mut self) -> Result<()> {
        if let Kind::Device { pending, .. } = &mut self.kind
            && !pending.is_empty()
        {
            let steps = read_steps(Tensor::cat(std::mem::take(pending), 0))?;
            self.known.extend(steps);
        }
        Ok(())
    }

    /// Mean loss of each batch under the current weights (no gradients, no dropout). The
    /// autodiff engine shares the batches among its threads; the fused one splits each batch.
    pub fn losses(&mut self, batches: &[Batch]) -> Result<Vec<f64>> {
        let workers = self.threads;
        match &mut self.kind {
            Kind::Autodiff(device) | Kind::Device { device, .. } => {
                let model = self.model.as_ref().context("the engine lost its model")?;
                // Estimated as trained: in the step's precision.
                let model = model.valid().autocast(self.dtype);
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

/// Steps from their `[loss, norm]` pairs, concatenated in `stats`, in one read back.
fn read_steps(stats: Tensor<1>) -> Result<Vec<Step>> {
    let values = stats.into_data().try_to_vec::<f32>();
    let values = values.map_err(|e| anyhow::anyhow!("step outcomes: {e:?}"))?;
    Ok(values
        .chunks_exact(2)
        .map(|pair| Step::new(f64::from(pair[0]), f64::from(pair[1])))
        .collect())
}

/// What a Burn step computes in.
struct Precision {
    /// The matmuls' dtype ([`Gpt::autocast`]).
    dtype: FloatDType,
    /// f16's loss scale, `[1]` on the (non-autodiff) device.
    loss_scale: Option<Tensor<1>>,
}

/// Gradients of the mean loss over `batches` through Burn's autodiff on `device` (dropout
/// masks from `dropout_seed`) in `precision`, still multiplied by its loss scale and not
/// clipped; and the mean loss `[1]`, on the device.
fn gradients(
    model: &Gpt,
    batches: &[Batch],
    device: &Device,
    dropout_seed: u64,
    precision: &Precision,
) -> Result<(GradientsParams, Tensor<1>)> {
    device.seed(dropout_seed);
    // Flash attention's in-kernel dropout draws its masks from its own stream: seeded per step
    // too, so a resumed run drops the same weights.
    tinygpt_attention::flash::seed_dropout(dropout_seed);
    let n = batches.len() as f64;
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum = Tensor::<1>::zeros([1], device);
    for batch in batches {
        // One thread: Burn's autodiff shares parameter leaf nodes between graphs, and two
        // backward passes running at once panic ("graph tape has already been consumed").
        // The casts to the step's dtype are graph nodes through which the gradients reach the
        // f32 `model`; each backward consumes its own, so each micro-batch casts again.
        let compute = (precision.dtype != FloatDType::F32).then(|| model.autocast(precision.dtype));
        let loss = batch_loss(compute.as_ref().unwrap_or(model), batch, device)? / n;
        let scaled = match &precision.loss_scale {
            Some(scale) => loss.clone() * Tensor::from_inner(scale.clone()),
            None => loss.clone(),
        };
        let grads = GradientsParams::from_grads(scaled.backward(), model);
        loss_sum = loss_sum + loss.detach();
        accumulator.accumulate(model, grads);
    }
    Ok((accumulator.grads(), loss_sum))
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
/// own clipping works per tensor), the scale computed on the device. Gradients of a loss
/// multiplied by `loss_scale` are divided by it in the same pass, and ‖g‖ is the unscaled norm.
fn clip_global_norm(
    model: &Gpt,
    grads: &mut GradientsParams,
    max_norm: f64,
    loss_scale: Option<Tensor<1>>,
) -> Option<Tensor<1>> {
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
    let (norm, factor) = clip_scale(Tensor::cat(norms.1, 0).sum(), max_norm, loss_scale);
    if let Some(factor) = factor {
        model.visit(&mut Scale(grads, factor));
    }
    Some(norm)
}

/// From the sum of the squared gradients `[1]` (of a loss multiplied by `loss_scale`, when
/// given): the unscaled norm ‖g‖ and the factor that unscales and clips the gradients to
/// `max_norm` (0 = no clipping; `None` when there is nothing to do). On the device.
fn clip_scale(
    squares: Tensor<1>,
    max_norm: f64,
    loss_scale: Option<Tensor<1>>,
) -> (Tensor<1>, Option<Tensor<1>>) {
    let mut norm = squares.sqrt();
    if let Some(loss_scale) = &loss_scale {
        norm = norm / loss_scale.clone();
    }
    let clip = (max_norm > 0.0).then(|| {
        (norm.clone() + 1e-6)
            .recip()
            .mul_scalar(max_norm)
            .clamp_max(1.0)
    });
    let factor = match (clip, loss_scale) {
        (Some(clip), Some(loss_scale)) => Some(clip / loss_scale),
        (None, Some(loss_scale)) => Some(loss_scale.recip()),
        (clip, None) => clip,
    };
    (norm, factor)
}

#[cfg(test)]
mod tests {
    use burn::module::Module;
    use burn::tensor::Device;
    use tinygpt_model::MomentState;

    use super::*;
    use crate::backend::Memory;
    use crate::bench::{VOCAB, random_tokens};
    use crate::config::RunConfig;
    use crate::config::presets::ConfigSource;
    use crate::train::optim::{adamw_settings, optimizer};
    use crate::train::session::train_step;

    fn config() -> RunConfig {
        let overrides = [
            "model.n_layer=2",
            "model.n_head=2",
            "model.n_embd=16",
            "model.block_size=8",
            "train.batch_size=3",
            "train.grad_accum=2",
            "train.warmup_iters=2",
        ];
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        ConfigSource::Preset("baby").load(&overrides).unwrap()
    }

    /// A model of `config`'s shape on flex, under autodiff.
    fn model(config: &RunConfig) -> Gpt {
        config.gpt(VOCAB).init(&Device::flex().autodiff()).unwrap()
    }

    /// An engine on flex for `model` as the CPU trains (Burn's AdamW, outcomes read at once),
    /// or as a GPU does (`device_like`: [`DeviceAdamW`], outcomes left on the device).
    fn engine(config: &RunConfig, model: Gpt, device_like: bool) -> Engine {
        engine_in(config, model, device_like, TrainDType::F32)
    }

    /// [`engine`] with its steps in `dtype`.
    fn engine_in(config: &RunConfig, model: Gpt, device_like: bool, dtype: TrainDType) -> Engine {
        let placement = Placement {
            device: Device::flex(),
            engine: crate::backend::EngineChoice::Autodiff,
            memory: if device_like {
                Memory::Unreported
            } else {
                Memory::Host
            },
            note: None,
        };
        let (optim, adamw) = (optimizer(config, &model), adamw_settings(config, &model));
        Engine::new(&placement, model, optim, adamw, 1, dtype)
            .unwrap()
            .0
    }

    fn weights(engine: &mut Engine) -> Vec<Vec<f32>> {
        let model = engine.model().unwrap().valid();
        let mut all = Vec::new();
        struct Collect<'a>(&'a mut Vec<Vec<f32>>);
        impl ModuleVisitor for Collect<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.0
                    .push(param.val().into_data().try_to_vec::<f32>().unwrap());
            }
        }
        model.visit(&mut Collect(&mut all));
        all
    }

    /// AdamW's state as the engine checkpoints it, read back.
    fn saved_moments(config: &RunConfig, engine: &mut Engine) -> Vec<MomentState> {
        let bytes = engine.optimizer_bytes().unwrap();
        let template = optimizer(config, engine.model().unwrap());
        let loaded = template
            .from_bytes(burn::tensor::Bytes::from_bytes_vec(bytes))
            .unwrap();
        moments_from_burn(&loaded).unwrap()
    }

    fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn the_device_engine_trains_as_burns_adamw_and_reads_outcomes_only_when_asked() {
        let config = config();
        let data = random_tokens(&config);
        let model = model(&config);
        let (mut cpu, mut gpu) = (
            engine(&config, model.clone(), false),
            engine(&config, model, true),
        );
        assert!(
            gpu.describe().contains("AdamW on the device"),
            "{}",
            gpu.describe()
        );
        let mut cpu_steps = Vec::new();
        for step in 0..6 {
            train_step(&mut cpu, &data, &config, step).unwrap();
            train_step(&mut gpu, &data, &config, step).unwrap();
            cpu_steps.extend(cpu.outcomes(false).unwrap());
            assert_eq!(
                cpu_steps.len(),
                step + 1,
                "the CPU's outcome is known at once"
            );
            assert!(
                gpu.outcomes(false).unwrap().is_empty(),
                "read before it was asked for"
            );
        }
        let gpu_steps = gpu.outcomes(true).unwrap();
        assert_eq!(gpu_steps.len(), 6);
        assert!(
            gpu.outcomes(true).unwrap().is_empty(),
            "each outcome is handed out once"
        );
        for (c, g) in cpu_steps.iter().zip(&gpu_steps) {
            assert!(c.applied && g.applied);
            assert!((c.loss - g.loss).abs() < 1e-5, "{c:?} vs {g:?}");
            assert!((c.grad_norm - g.grad_norm).abs() < 1e-4, "{c:?} vs {g:?}");
        }
        let difference = max_difference(&weights(&mut cpu), &weights(&mut gpu));
        assert!(difference < 2e-6, "weights differ by {difference}");
        // Both checkpoint Burn's optimizer record, with the same step counts and moments.
        let (want, got) = (
            saved_moments(&config, &mut cpu),
            saved_moments(&config, &mut gpu),
        );
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert_eq!((w.id, w.time, &w.shape), (g.id, g.time, &g.shape));
            assert_eq!(w.time, 6);
            let difference = max_difference(
                &[w.moment_1.clone(), w.moment_2.clone()],
                &[g.moment_1.clone(), g.moment_2.clone()],
            );
            assert!(
                difference < 1e-6,
                "moments of {:?} differ by {difference}",
                w.id
            );
        }
    }

    /// On a GPU (lavapipe in CI) the device engine's flat AdamW is the fused kernel, with the
    /// fused LayerNorm and loss: it trains as Burn's ops and Burn's AdamW do on flex.
    #[test]
    fn the_fused_kernels_on_a_gpu_train_as_burns_ops_on_the_cpu() {
        let Some(gpu) = crate::backend::Backend::Wgpu.placement().ok() else {
            assert!(std::env::var_os("CI").is_none(), "CI must run wgpu");
            eprintln!(
                "\n!!! NO WGPU ADAPTER FOUND: the fused-kernel engine test did not run !!!\n"
            );
            return;
        };
        let config = config();
        let data = random_tokens(&config);
        let model = model(&config);
        let on_gpu = config
            .gpt(VOCAB)
            .init(&gpu.device.clone().autodiff())
            .unwrap()
            .load_record(model.clone().into_record());
        let mut cpu = engine(&config, model, false);
        let (optim, adamw) = (
            optimizer(&config, &on_gpu),
            adamw_settings(&config, &on_gpu),
        );
        let (mut gpu, _) = Engine::new(&gpu, on_gpu, optim, adamw, 1, TrainDType::F32).unwrap();
        assert_eq!(gpu.kind(), EngineKind::Device);
        for step in 0..4 {
            train_step(&mut cpu, &data, &config, step).unwrap();
            train_step(&mut gpu, &data, &config, step).unwrap();
        }
        let (want, got) = (cpu.outcomes(true).unwrap(), gpu.outcomes(true).unwrap());
        for (c, g) in want.iter().zip(&got) {
            assert!((c.loss - g.loss).abs() < 1e-4, "{c:?} vs {g:?}");
            assert!(
                (c.grad_norm - g.grad_norm).abs() < 1e-3 * c.grad_norm,
                "{c:?} vs {g:?}"
            );
        }
        let difference = max_difference(&weights(&mut cpu), &weights(&mut gpu));
        assert!(difference < 1e-4, "weights differ by {difference}");
        let (want, got) = (
            saved_moments(&config, &mut cpu),
            saved_moments(&config, &mut gpu),
        );
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(&got) {
            assert_eq!((w.id, w.time), (g.id, g.time));
        }
    }

    #[test]
    fn mixed_precision_steps_see_the_f32_loss_and_update_f32_weights() {
        let config = config();
        let data = random_tokens(&config);
        let model = model(&config);
        let mut outcomes = Vec::new();
        for (dtype, device_like) in [
            (TrainDType::F32, false),
            (TrainDType::Bf16, false),
            (TrainDType::F16, false),
            (TrainDType::Bf16, true),
            (TrainDType::F16, true),
        ] {
            let mut engine = engine_in(&config, model.clone(), device_like, dtype);
            for step in 0..3 {
                train_step(&mut engine, &data, &config, step).unwrap();
            }
            let steps = engine.outcomes(true).unwrap();
            assert_eq!(steps.len(), 3);
            assert!(steps.iter().all(|s| s.applied), "{dtype:?}: {steps:?}");
            // The master weights stay f32 (what checkpoints save), and they moved.
            let trained = engine.model().unwrap().valid();
            assert_eq!(trained.wte.weight.dtype(), burn::tensor::DType::F32);
            assert_eq!(
                trained.h[0].attn.c_attn.weight.dtype(),
                burn::tensor::DType::F32
            );
            outcomes.push((dtype, steps, weights(&mut engine)));
        }
        let (_, f32_steps, f32_weights) = &outcomes[0];
        for (dtype, steps, weights) in &outcomes[1..] {
            // Step 0: the same weights and batch, the matmuls in 8 (bf16) or 11 (f16) bits.
            let difference = (steps[0].loss - f32_steps[0].loss).abs();
            assert!(
                difference < 1e-2,
                "{dtype:?}: step-0 loss off by {difference}"
            );
            // The f16 loss scale is divided out again: norms as f32's, to the dtype's digits.
            let ratio = steps[0].grad_norm / f32_steps[0].grad_norm;
            assert!((ratio - 1.0).abs() < 0.05, "{dtype:?}: norm ratio {ratio}");
            let moved = max_difference(weights, f32_weights);
            assert!(
                moved > 0.0 && moved < 1e-2,
                "{dtype:?}: weights off by {moved}"
            );
        }
    }

    #[test]
    fn a_non_finite_step_on_the_device_changes_no_weight_and_no_moment() {
        let mut config = config();
        let data = random_tokens(&config);
        let mut gpu = engine(&config, model(&config), true);
        train_step(&mut gpu, &data, &config, 0).unwrap();
        // An absurd learning rate: the update is finite and applied, and blows the weights up
        // so that every later step's loss is not finite.
        config.train.learning_rate = 1e30;
        config.train.warmup_iters = 0;
        train_step(&mut gpu, &data, &config, 1).unwrap();
        let blown = gpu.outcomes(true).unwrap();
        assert!(blown.iter().all(|s| s.applied), "{blown:?}");
        let weights_before = weights(&mut gpu);
        let moments_before = saved_moments(&config, &mut gpu);
        for step in 2..5 {
            train_step(&mut gpu, &data, &config, step).unwrap();
        }
        let skipped = gpu.outcomes(true).unwrap();
        assert_eq!(skipped.len(), 3);
        assert!(skipped.iter().all(|s| !s.applied), "{skipped:?}");
        let bits =
            |w: Vec<Vec<f32>>| -> Vec<u32> { w.iter().flatten().map(|x| x.to_bits()).collect() };
        assert!(
            bits(weights(&mut gpu)) == bits(weights_before),
            "a skipped step changed a weight"
        );
        let moments_after = saved_moments(&config, &mut gpu);
        assert_eq!(moments_after.len(), moments_before.len());
        for (after, before) in moments_after.iter().zip(&moments_before) {
            assert_eq!((after.id, after.time), (before.id, before.time));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&after.moment_1) == bits(&before.moment_1),
                "moment 1 changed"
            );
            assert!(
                bits(&after.moment_2) == bits(&before.moment_2),
                "moment 2 changed"
            );
        }
    }
}
