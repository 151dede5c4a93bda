//! What the two Burn engines (autodiff and device) share: the gradients of a step in its
//! precision, the global norm and the clipping factor, the loss of a batch, and losses over
//! many batches on several threads.

use anyhow::{Context, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, FloatDType, Tensor, TensorData};
use tinygpt_model::{
    Gpt, Pass, gpu::sum_all, step::clip_factor_on_device, step::cross_entropy_counted,
};

use super::Step;
use crate::config::TrainDType;
use crate::data::{Batch, mix};
use crate::distributed::Ranks;
use crate::train::loss_scale::LossScale;

/// What both Burn engines hold: the model, where it runs, and what its steps compute in.
pub(super) struct BurnModel {
    /// The model, on the autodiff form of `device`. `None` only while an update replaces it.
    pub model: Option<Gpt>,
    /// The inner (non-autodiff) device.
    pub device: Device,
    /// Threads the loss estimates share batches among.
    pub threads: usize,
    pub precision: Precision,
}

impl BurnModel {
    pub fn new(model: Gpt, device: Device, threads: usize, dtype: TrainDType) -> Self {
        Self {
            precision: Precision::new(dtype, &device),
            model: Some(model),
            device,
            threads,
        }
    }

    /// The model.
    pub fn held(&self) -> Result<&Gpt> {
        self.model.as_ref().context(super::LOST)
    }

    /// The model, taken out to be replaced by its update.
    pub fn take(&mut self) -> Result<Gpt> {
        self.model.take().context(super::LOST)
    }

    /// [`gradients`] of the held model; with `ranks`, of this rank's micro-batches, then
    /// added up over the ranks.
    pub fn gradients(
        &self,
        batches: &[Batch],
        dropout_seed: u64,
        ranks: Option<&Ranks>,
    ) -> Result<(GradientsParams, Tensor<1>, Option<Tensor<1>>)> {
        let model = self.held()?;
        let (mut grads, mut loss, scale) =
            gradients(model, batches, dropout_seed, &self.precision, ranks)?;
        if let Some(ranks) = ranks {
            sum_over(ranks, model, &mut grads);
            loss = summed(ranks, loss)?;
        }
        Ok((grads, loss, scale))
    }

    /// [`losses`] of the held model, in the steps' precision.
    pub fn losses(&self, batches: &[Batch]) -> Result<Vec<f64>> {
        let model = self.held()?;
        let dtype = self.precision.dtype;
        losses(model, dtype, &self.device, batches, self.threads)
    }
}

/// What a Burn step computes in: the matmuls' dtype ([`Gpt::autocast`]) and f16's loss scale.
pub(super) struct Precision {
    pub dtype: FloatDType,
    /// f16's loss scale; `None` in f32 and bf16.
    pub loss_scale: Option<LossScale>,
}

impl Precision {
    /// `dtype`'s precision, its loss scale (f16's) on `device`.
    pub fn new(dtype: TrainDType, device: &Device) -> Self {
        Self {
            dtype: dtype.float(),
            loss_scale: (dtype == TrainDType::F16).then(|| LossScale::new(device)),
        }
    }

    /// The current loss scale, `[1]` on the (non-autodiff) device.
    pub fn scale(&self) -> Option<Tensor<1>> {
        self.loss_scale.as_ref().map(LossScale::scale)
    }

    /// `engine` (a description) with this precision, when not f32.
    pub fn describe(&self, engine: &str) -> String {
        match (self.dtype, &self.loss_scale) {
            (FloatDType::F32, _) => engine.to_string(),
            (dtype, None) => format!("{engine}, {dtype:?} matmuls"),
            (dtype, Some(_)) => format!("{engine}, {dtype:?} matmuls with a loss scale"),
        }
    }
}

/// Gradients of the mean loss over `batches` (with `ranks`, over this rank's share of them:
/// micro-batch `k` where `k mod N` is its rank) through Burn's autodiff on the model's autodiff
/// device (with its checkpointing strategy; micro-batch `k`'s dropout masks from `dropout_seed`
/// and `k`) in `precision`, still multiplied by its loss scale and not clipped; the mean loss
/// `[1]`, on the device; and the loss scale they carry.
fn gradients(
    model: &Gpt,
    batches: &[Batch],
    dropout_seed: u64,
    precision: &Precision,
    ranks: Option<&Ranks>,
) -> Result<(GradientsParams, Tensor<1>, Option<Tensor<1>>)> {
    let (device, dtype) = (model.wte.weight.device(), precision.dtype);
    let loss_scale = precision.scale();
    let n = batches.len() as f64;
    let mut accumulator = GradientsAccumulator::new();
    let mut loss_sum = Tensor::<1>::zeros([1], &device);
    let (rank, size) = ranks.map_or((0, 1), |r| (r.rank(), r.size()));
    for (k, batch) in batches.iter().enumerate().skip(rank).step_by(size) {
        // Each micro-batch's masks from the step's seed and its index alone, as the fused
        // engine draws them: dealt to another rank, a micro-batch drops what it drops in one
        // process. Held until its draws are made: another trainer in this process seeding at
        // once would interleave its draws with these. Flash attention's in-kernel dropout
        // draws from a stream of its own, seeded alike.
        let seed = mix(dropout_seed, k, 0);
        let _streams = tinygpt_model::seeded(&device, seed);
        tinygpt_attention::flash::seed_dropout(seed);
        // One thread: Burn's autodiff shares parameter leaf nodes between graphs, and two
        // backward passes running at once panic ("graph tape has already been consumed").
        // The casts to the step's dtype (and a tied embedding's one read) are graph nodes
        // through which the gradients reach the f32 `model`; each backward consumes its own,
        // so each micro-batch makes them again.
        let compute = model.autocast(dtype);
        let loss = batch_loss(&compute, batch, &device, Pass::Train)? / n;
        let scaled = match &loss_scale {
            Some(scale) => loss.clone() * Tensor::from_inner(scale.clone()),
            None => loss.clone(),
        };
        let grads = GradientsParams::from_grads(scaled.backward(), model);
        loss_sum = loss_sum + loss.detach();
        accumulator.accumulate(model, grads);
    }
    Ok((accumulator.grads(), loss_sum, loss_scale))
}

/// `grads` added up over `ranks`, parameter by parameter in `model`'s order, through the host.
fn sum_over(ranks: &Ranks, model: &Gpt, grads: &mut GradientsParams) {
    struct Sum<'a>(&'a mut GradientsParams, &'a Ranks);
    impl ModuleVisitor for Sum<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let Some(g) = self.0.remove::<D>(param.id) else {
                return;
            };
            let (shape, device) = (g.shape(), g.device());
            let mut values = g
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .expect("gradients convert to f32");
            self.1.sum_f32(&mut values);
            let data = TensorData::new(values, shape);
            self.0
                .register(param.id, Tensor::<D>::from_data(data, &device));
        }
    }
    model.visit(&mut Sum(grads, ranks));
}

/// `loss` (`[1]`) added up over `ranks`.
fn summed(ranks: &Ranks, loss: Tensor<1>) -> Result<Tensor<1>> {
    let device = loss.device();
    let values = loss.into_data().convert::<f32>().try_into_vec::<f32>();
    let mut values = values.map_err(|e| anyhow::anyhow!("loss: {e:?}"))?;
    ranks.sum_f32(&mut values);
    Ok(Tensor::from_data(TensorData::new(values, [1]), &device))
}

/// Mean next-token loss of a batch through Burn. The batch's ids and its count of kept targets
/// are checked on the host, so nothing is read back from the device.
fn batch_loss(model: &Gpt, batch: &Batch, device: &Device, pass: Pass) -> Result<Tensor<1>> {
    model.check_tokens(&batch.inputs)?;
    let kept = batch.kept_targets()?;
    let (inputs, targets) = batch.to_device(device);
    let logits = model.forward(inputs, pass)?;
    let [b, s, v] = logits.dims();
    Ok(cross_entropy_counted(
        logits.reshape([b * s, v]),
        targets,
        kept,
        model.kernels(),
    )?)
}

/// Mean loss of each batch under `model`'s weights in `dtype` (no gradients, no dropout), the
/// batches shared among `workers` threads, read back in one transfer.
fn losses(
    model: &Gpt,
    dtype: FloatDType,
    device: &Device,
    batches: &[Batch],
    workers: usize,
) -> Result<Vec<f64>> {
    // Estimated as trained: in the step's precision.
    let model = model.valid().autocast(dtype);
    let losses = parallel(batches, workers, |batch| {
        batch_loss(&model, batch, device, Pass::Infer)
    })
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    if losses.is_empty() {
        return Ok(Vec::new());
    }
    let values = Tensor::cat(losses, 0).into_data().try_to_vec::<f32>();
    let values = values.map_err(|e| anyhow::anyhow!("losses: {e:?}"))?;
    Ok(values.into_iter().map(f64::from).collect())
}

/// Steps from their `[loss, norm]` pairs, concatenated in `stats`, in one read back.
pub(super) fn read_steps(stats: Tensor<1>) -> Result<Vec<Step>> {
    let values = stats.into_data().try_to_vec::<f32>();
    let values = values.map_err(|e| anyhow::anyhow!("step outcomes: {e:?}"))?;
    Ok(values
        .chunks_exact(2)
        .map(|pair| Step::new(f64::from(pair[0]), f64::from(pair[1])))
        .collect())
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

/// The norm ‖g‖ of all gradients together, `[1]` on the device (`None` without gradients); with
/// `max_norm > 0`, every gradient is clipped by the global norm ([`clip_scale`]), the factor
/// computed on the device.
/// Gradients of a loss multiplied by `loss_scale` are divided by it in the same pass, and ‖g‖
/// is the unscaled norm.
pub(super) fn clip_global_norm(
    model: &Gpt,
    grads: &mut GradientsParams,
    max_norm: f64,
    loss_scale: Option<Tensor<1>>,
) -> Option<Tensor<1>> {
    struct SquaredNorms<'a>(&'a GradientsParams, Vec<Tensor<1>>);
    impl ModuleVisitor for SquaredNorms<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.0.get::<D>(param.id) {
                let n = g.shape().num_elements();
                self.1.push(sum_all(g.square().reshape([n])));
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
/// `max_norm` (0 = no clipping; `None` when there is nothing to do), by the one clipping rule
/// ([`clip_factor_on_device`]). On the device.
pub(super) fn clip_scale(
    squares: Tensor<1>,
    max_norm: f64,
    loss_scale: Option<Tensor<1>>,
) -> (Tensor<1>, Option<Tensor<1>>) {
    let mut norm = squares.sqrt();
    if let Some(loss_scale) = &loss_scale {
        norm = norm / loss_scale.clone();
    }
    let clip = (max_norm > 0.0).then(|| clip_factor_on_device(norm.clone(), max_norm));
    let factor = match (clip, loss_scale) {
        (Some(clip), Some(loss_scale)) => Some(clip / loss_scale),
        (None, Some(loss_scale)) => Some(loss_scale.recip()),
        (clip, None) => clip,
    };
    (norm, factor)
}
