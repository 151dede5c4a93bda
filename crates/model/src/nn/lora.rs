//! A [`Gpt`] with LoRA adapters attached, through Burn's own reparameterisation
//! ([`Module::apply_lora`]): each adapted matrix's parameter computes `W + scale · A · B`
//! wherever it is read, so the forward, the decoders and the GPU kernels run unchanged; every
//! other parameter is frozen. The factors are parameters of their own, at
//! `h.{l}.{matrix}.weight.lora.a` and `.b` ([`adapter_path`]), which the optimizers, the fused
//! engine ([`ParamLayout::of`](crate::ParamLayout::of)) and checkpoints find by those paths.

use burn::module::{Lora, LoraAdapter, Module, Param, ParamGroup, Reparameterizer};
use burn::nn::{DropoutConfig, Linear};
use burn::tensor::{Device, Distribution, Tensor, TensorData};

use super::gpt::Gpt;
use crate::arch::{BaseWeights, Factor, LoraConfig, LoraTarget, TrainedPart, trained_beside};
use crate::error::GptConfigError;

/// Burn's path of the adapter factor on block `layer`'s `target` matrix.
pub fn adapter_path(layer: usize, target: LoraTarget, factor: Factor) -> String {
    format!("{}.lora.{}", matrix_path(layer, target), factor.name())
}

/// Burn's [`Lora`], but a parameter not yet read (a base read from its file as it is used,
/// [`Gpt::with_lora`] on a model loaded lazily) stays unread: Burn's reads every matrix to
/// learn its shape and dtype, which would make the whole base in f32 at once. The factors are
/// drawn as Burn draws them, in the same order (`A ~ N(0, 1/rank)`, `B = 0`, at f32, the
/// dtype such a base is read in).
struct Lazily(Lora);

impl Reparameterizer for Lazily {
    type Reparam = LoraAdapter;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LoraAdapter>) {
        if param.is_initialized() {
            return self.0.reparameterize(path, param);
        }
        let (id, device, shape) = (param.id, param.lazy_device(), param.lazy_shape());
        let base = param.set_require_grad(false);
        if D != 2 || !self.0.param_group.matches(&id, Some(path)) {
            return (base, None);
        }
        let (rank, (d_in, d_out)) = (self.0.rank, (shape[0], shape[1]));
        let std = self.0.init_std.unwrap_or(1.0 / rank as f64);
        // Persistent, as Burn places them: the factors live as long as the model.
        let (a, b) = device.memory_persistent_allocations((), |_| {
            let a = Tensor::<2>::random([d_in, rank], Distribution::Normal(0.0, std), &device);
            (a, Tensor::<2>::zeros([rank, d_out], &device))
        });
        let adapter = LoraAdapter {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            scale: self.0.alpha / rank as f64,
        };
        (base, Some(adapter))
    }
}

/// Burn's path of block `layer`'s `target` matrix.
fn matrix_path(layer: usize, target: LoraTarget) -> String {
    format!("h.{layer}.{}.weight", target.path())
}

impl Gpt {
    /// This model with adapters of `lora`'s rank and scale on the matrices it names, in every
    /// block: `A ~ N(0, 1/rank)` (Burn's draw, from the device's random stream: seed it with
    /// [`seeded`](crate::seeded)), `B = 0`, so the model computes what it did; every base
    /// parameter is frozen (no gradient), the factors train, and so do the parts of the base
    /// `lora.also_train` names ([`TrainedPart`]). With `lora.base = q8_0` or `q4_k` every
    /// block's matrices are first rounded to those blocks ([`BaseWeights`]). Refuses a `lora`
    /// that [`LoraConfig::validate`] refuses for this model, and a model with adapters already.
    pub fn with_lora(self, lora: &LoraConfig) -> Result<Self, GptConfigError> {
        lora.validate(self.config())?;
        if self.lora_scale().is_some() {
            return Err(GptConfigError::Lora(
                "the model has adapters already".into(),
            ));
        }
        let targets = lora.targets(self.config());
        let paths: Vec<String> = (0..self.config().n_layer)
            .flat_map(|l| targets.iter().map(move |&t| matrix_path(l, t)))
            .collect();
        let burn = Lora::new(lora.rank, lora.scale() * lora.rank as f64)
            .set_param_group(ParamGroup::from_paths(paths));
        let base = match lora.base {
            BaseWeights::F32 => self,
            BaseWeights::Q8_0 | BaseWeights::Q4K => self.rounded_to(lora.base),
        };
        let trained = trained_beside(base.config(), &lora.also_train);
        let trained: Vec<String> = trained.into_iter().map(|p| p.burn).collect();
        let mut adapted = base.apply_reparameterization(Lazily(burn));
        if !trained.is_empty() {
            adapted = adapted.unfreeze_group(ParamGroup::from_paths(trained));
        }
        adapted = adapted.with_adapter_dropout(lora.dropout);
        adapted.lora_base = lora.base;
        adapted.lora_also_train = lora.also_train.clone();
        Ok(adapted)
    }

    /// The parts of the base that train in full beside the adapters (`[lora] also_train`):
    /// none without adapters.
    pub fn lora_also_train(&self) -> &[TrainedPart] {
        &self.lora_also_train
    }

    /// How the frozen base's matrices are held while its adapters train (`[lora] base`):
    /// `f32` without adapters.
    pub fn lora_base(&self) -> BaseWeights {
        self.lora_base
    }

    /// This model with every block's matrices rounded along their inputs to the blocks `base`
    /// holds them in (`Q8_0`; `Q4_K`, or `Q5_0` where the inputs are not whole super-blocks;
    /// none where they are not whole blocks of 32), one matrix at a time.
    fn rounded_to(mut self, base: BaseWeights) -> Self {
        let round = |linear: &mut Linear| {
            // Its shape without reading it (`dims` would make a lazy parameter).
            let shape = linear.weight.lazy_shape();
            let [n_in, n_out] = [shape[0], shape[1]];
            if base.held_as(n_in).is_none() {
                return;
            }
            let round = move |w: Tensor<2>| {
                let device = w.device();
                let mut values = w
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("weights are f32");
                base.round(&mut values, n_in);
                Tensor::from_data(TensorData::new(values, [n_in, n_out]), &device)
            };
            let weight = linear.weight.clone();
            linear.weight = match weight.is_initialized() {
                true => weight.map(round),
                // Not read yet (a base read from its file as it is used): rounded when it is,
                // so that the base is never made whole in f32 here.
                false => {
                    let (id, device) = (weight.id, weight.lazy_device());
                    let shape = weight.lazy_shape();
                    let made = move |_: &Device, require_grad: bool| {
                        round(weight.val()).set_require_grad(require_grad)
                    };
                    Param::uninitialized(id, made, device, true, shape)
                }
            };
        };
        for block in &mut self.h {
            round(&mut block.attn.c_attn);
            round(&mut block.attn.c_proj);
            if let Some(mlp) = &mut block.mlp {
                round(&mut mlp.c_fc);
                round(&mut mlp.c_proj);
            }
        }
        self
    }

    /// The dropout on the adapters' inputs while training (`[lora] dropout`): 0 without
    /// adapters or without dropout. The fused CPU engine draws its own masks; Burn's engines
    /// run Burn's dropout in each adapted layer's product (`tinygpt_attention::lora`), in f32
    /// (a mixed-precision step casts the weights, adapters merged, so the trainer refuses it
    /// there).
    pub fn lora_dropout(&self) -> f64 {
        self.lora_dropout
    }

    /// This model with dropout `p` on its adapters' inputs, in every block's layers.
    fn with_adapter_dropout(mut self, p: f64) -> Self {
        self.lora_dropout = p;
        for block in &mut self.h {
            block.attn = block.attn.clone().with_adapter_dropout(p);
            if let Some(mlp) = &mut block.mlp {
                mlp.adapter_dropout = DropoutConfig::new(p).init();
            }
        }
        self
    }

    /// The scale (`alpha / rank`) of the adapters attached, `None` without any.
    pub fn lora_scale(&self) -> Option<f64> {
        self.h.iter().find_map(|block| {
            let attn = [&block.attn.c_attn, &block.attn.c_proj];
            let mlp = block.mlp.iter().flat_map(|m| [&m.c_fc, &m.c_proj]);
            let mut linears = attn.into_iter().chain(mlp);
            linears.find_map(|linear| linear.weight.adapter().map(|a| a.scale))
        })
    }

    /// The model with its adapters merged into the matrices (`W + scale · A · B`, one dense
    /// weight each, as before they were attached): what sampling, serving and exports read.
    /// A model without adapters is returned as it is.
    pub fn merge_lora(self) -> Self {
        match self.lora_scale() {
            Some(_) => {
                let mut merged = self.materialize().with_adapter_dropout(0.0);
                merged.lora_base = BaseWeights::F32;
                merged.lora_also_train = Vec::new();
                merged
            }
            None => self,
        }
    }
}
