//! The model's parameters as flat `f32` buffers, read from a [`Gpt`] and written back as
//! gradients keyed by the same [`ParamId`]s. Which buffers there are, in which order and of which
//! shapes comes from [`parameter_table`]: each table [`Slot`] names the field it is kept in.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};

use crate::gpt::Gpt;
use crate::parameters::{BlockSlot, Entry, Slot, parameter_table, parameters_by_path};

/// One block's parameters. Linear weights are `[in, out]` as in Burn; empty = absent (no bias).
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockParams {
    pub ln_1_gamma: Vec<f32>,
    pub ln_1_beta: Vec<f32>,
    /// `[width, 3·width]`.
    pub c_attn_w: Vec<f32>,
    pub c_attn_b: Vec<f32>,
    /// `[width, width]`.
    pub attn_proj_w: Vec<f32>,
    pub attn_proj_b: Vec<f32>,
    pub ln_2_gamma: Vec<f32>,
    pub ln_2_beta: Vec<f32>,
    /// `[width, hidden]`.
    pub c_fc_w: Vec<f32>,
    pub c_fc_b: Vec<f32>,
    /// `[hidden, width]`.
    pub mlp_proj_w: Vec<f32>,
    pub mlp_proj_b: Vec<f32>,
}

/// The field each of a block's slots is kept in: one exhaustive match each way (shared and
/// mutable), so a slot added to the table does not compile until it has a field.
macro_rules! block_fields {
    ($($slot:ident => $field:ident),* $(,)?) => {
        impl BlockParams {
            fn buffer(&self, slot: BlockSlot) -> &Vec<f32> {
                match slot {
                    $(BlockSlot::$slot => &self.$field,)*
                }
            }

            fn buffer_mut(&mut self, slot: BlockSlot) -> &mut Vec<f32> {
                match slot {
                    $(BlockSlot::$slot => &mut self.$field,)*
                }
            }
        }
    };
}

block_fields! {
    Ln1Gain => ln_1_gamma,
    Ln1Bias => ln_1_beta,
    AttnWeight => c_attn_w,
    AttnBias => c_attn_b,
    AttnProjWeight => attn_proj_w,
    AttnProjBias => attn_proj_b,
    Ln2Gain => ln_2_gamma,
    Ln2Bias => ln_2_beta,
    FcWeight => c_fc_w,
    FcBias => c_fc_b,
    MlpProjWeight => mlp_proj_w,
    MlpProjBias => mlp_proj_b,
}

/// Every parameter of a [`Gpt`] (or a gradient of the same shape): a buffer per
/// [`parameter_table`] slot, kept in fields by kind for the kernels.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
    /// The table's slots, in its order: the order every loop over all parameters takes.
    order: Vec<Slot>,
    /// `[vocab, width]`; also the LM head when tied.
    pub wte: Vec<f32>,
    /// `[block_size, width]`.
    pub wpe: Vec<f32>,
    pub blocks: Vec<BlockParams>,
    pub ln_f_gamma: Vec<f32>,
    pub ln_f_beta: Vec<f32>,
    /// Untied head `[width, vocab]`; empty when tied.
    pub lm_head: Vec<f32>,
}

impl Params {
    fn buffer(&self, slot: Slot) -> &Vec<f32> {
        match slot {
            Slot::TokenEmbedding => &self.wte,
            Slot::PositionEmbedding => &self.wpe,
            Slot::Block(l, s) => self.blocks[l].buffer(s),
            Slot::FinalNormGain => &self.ln_f_gamma,
            Slot::FinalNormBias => &self.ln_f_beta,
            Slot::LmHead => &self.lm_head,
        }
    }

    fn buffer_mut(&mut self, slot: Slot) -> &mut Vec<f32> {
        match slot {
            Slot::TokenEmbedding => &mut self.wte,
            Slot::PositionEmbedding => &mut self.wpe,
            Slot::Block(l, s) => self.blocks[l].buffer_mut(s),
            Slot::FinalNormGain => &mut self.ln_f_gamma,
            Slot::FinalNormBias => &mut self.ln_f_beta,
            Slot::LmHead => &mut self.lm_head,
        }
    }
}

/// The model's parameters in [`parameter_table`]'s order, with their slots; `None` where a slot
/// is absent.
fn entries(gpt: &Gpt) -> Vec<(Slot, Option<Entry>)> {
    let mut by_path = parameters_by_path(gpt);
    parameter_table(&gpt.config)
        .into_iter()
        .map(|name| (name.slot, by_path.remove(&name.burn)))
        .collect()
}

/// Each slot's parameter id and shape (`None` where absent), in [`Params::order`].
pub(crate) fn layout(gpt: &Gpt) -> Vec<Option<(ParamId, Vec<usize>)>> {
    entries(gpt)
        .into_iter()
        .map(|(_, e)| e.map(|e| (e.id, e.shape)))
        .collect()
}

impl Params {
    /// The table's slots, in its order.
    pub(crate) fn order(&self) -> &[Slot] {
        &self.order
    }

    /// The buffer of `slot` (empty where the model lacks it).
    pub(crate) fn slot(&self, slot: Slot) -> &[f32] {
        self.buffer(slot)
    }

    pub(crate) fn slot_mut(&mut self, slot: Slot) -> &mut Vec<f32> {
        self.buffer_mut(slot)
    }

    /// `out [width] = wte[token] + wpe[position]`: one token's input to the first block.
    pub(crate) fn embed(&self, out: &mut [f32], token: usize, position: usize) {
        let c = out.len();
        let (te, pe) = (token * c, position * c);
        for ((x, a), b) in out
            .iter_mut()
            .zip(&self.wte[te..te + c])
            .zip(&self.wpe[pe..pe + c])
        {
            *x = a + b;
        }
    }

    /// `gpt` with these values as its parameters (ids, devices and `require_grad` kept).
    pub(crate) fn write(&self, gpt: Gpt) -> Gpt {
        struct Write(HashMap<ParamId, Vec<f32>>);
        impl ModuleMapper for Write {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let Some(values) = self.0.remove(&param.id) else {
                    return param;
                };
                param.map(|tensor| {
                    let data = TensorData::new(values, tensor.shape());
                    let new = Tensor::from_data(data, &tensor.device());
                    if tensor.is_require_grad() {
                        new.require_grad()
                    } else {
                        new
                    }
                })
            }
        }
        let values = self
            .order
            .iter()
            .zip(layout(&gpt))
            .filter_map(|(&slot, entry)| entry.map(|(id, _)| (id, self.slot(slot).to_vec())))
            .collect();
        gpt.map(&mut Write(values))
    }

    /// Copies the model's current values (one host read per parameter).
    pub(crate) fn read(gpt: &Gpt) -> Self {
        let mut params = Self {
            blocks: vec![BlockParams::default(); gpt.h.len()],
            ..Self::default()
        };
        for (slot, entry) in entries(gpt) {
            params.order.push(slot);
            *params.slot_mut(slot) = entry.map_or_else(Vec::new, |e| {
                e.values
                    .into_data()
                    .try_into_vec::<f32>()
                    .expect("parameters are f32")
            });
        }
        params
    }

    /// Zeros shaped like `like`, kept allocations reused.
    pub(crate) fn zero_like(&mut self, like: &Self) {
        self.blocks.resize_with(like.blocks.len(), Default::default);
        self.order.clone_from(&like.order);
        for &slot in &like.order {
            let buffer = self.slot_mut(slot);
            buffer.clear();
            buffer.resize(like.slot(slot).len(), 0.0);
        }
    }

    /// `self += other`, slot by slot.
    pub(crate) fn add(&mut self, other: &Self) {
        for &slot in &other.order {
            let sum = self.slot_mut(slot);
            sum.iter_mut()
                .zip(other.slot(slot))
                .for_each(|(a, b)| *a += b);
        }
    }

    /// Scales every value by `min(1, max_norm / (‖self‖ + 1e-6))` and returns ‖self‖, the
    /// Euclidean norm of all values together.
    pub(crate) fn scale_to_norm(&mut self, max_norm: f64) -> f64 {
        let squares: f64 = self
            .order
            .iter()
            .map(|&slot| {
                let values = self.slot(slot);
                values.iter().map(|&g| f64::from(g * g)).sum::<f64>()
            })
            .sum();
        let norm = squares.sqrt();
        let scale = max_norm / (norm + 1e-6);
        if scale < 1.0 {
            for slot in self.order.clone() {
                let values = self.slot_mut(slot);
                values.iter_mut().for_each(|g| *g *= scale as f32);
            }
        }
        norm
    }

    /// These values as the gradients of `gpt`'s parameters, on the device the optimizer reads
    /// gradients from (the backend under autodiff).
    pub(crate) fn to_gradients(&self, gpt: &Gpt) -> GradientsParams {
        let mut grads = GradientsParams::new();
        for (slot, entry) in entries(gpt) {
            let Some(entry) = entry else { continue };
            let values = self.slot(slot);
            let device: Device = entry.values.device().inner();
            let flat =
                Tensor::<1>::from_data(TensorData::new(values.to_vec(), [values.len()]), &device);
            match entry.shape[..] {
                [n] => grads.register(entry.id, flat.reshape([n])),
                [a, b] => grads.register(entry.id, flat.reshape([a, b])),
                _ => unreachable!("GPT parameters are 1-D or 2-D"),
            }
        }
        grads
    }
}
