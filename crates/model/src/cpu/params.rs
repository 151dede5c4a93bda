//! The model's parameters as flat `f32` buffers, read from a [`Gpt`] and written back as
//! gradients keyed by the same [`ParamId`]s.

use std::collections::HashMap;

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Tensor, TensorData};

use crate::gpt::Gpt;
use crate::parameters::{Entry, parameter_table, parameters_by_path};

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
    /// `[width, 4·width]`.
    pub c_fc_w: Vec<f32>,
    pub c_fc_b: Vec<f32>,
    /// `[4·width, width]`.
    pub mlp_proj_w: Vec<f32>,
    pub mlp_proj_b: Vec<f32>,
}

/// Every parameter of a [`Gpt`] (or a gradient of the same shape).
#[derive(Debug, Clone, Default)]
pub(crate) struct Params {
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

/// The model's parameters in [`parameter_table`]'s order; `None` where a slot is absent.
fn entries(gpt: &Gpt) -> Vec<Option<Entry>> {
    let mut by_path = parameters_by_path(gpt);
    parameter_table(&gpt.config)
        .into_iter()
        .map(|slot| by_path.remove(&slot.burn))
        .collect()
}

/// The buffers of a [`Params`] in [`parameter_table`]'s order, as shared (`slots!(p,)`) or
/// mutable (`slots!(p, mut)`) references: where each slot of the table is stored.
macro_rules! slots {
    ($params:expr, $($mut:tt)?) => {{
        let p = $params;
        let mut out = vec![&$($mut)? p.wte, &$($mut)? p.wpe];
        for b in &$($mut)? p.blocks {
            out.extend([
                &$($mut)? b.ln_1_gamma,
                &$($mut)? b.ln_1_beta,
                &$($mut)? b.c_attn_w,
                &$($mut)? b.c_attn_b,
                &$($mut)? b.attn_proj_w,
                &$($mut)? b.attn_proj_b,
                &$($mut)? b.ln_2_gamma,
                &$($mut)? b.ln_2_beta,
                &$($mut)? b.c_fc_w,
                &$($mut)? b.c_fc_b,
                &$($mut)? b.mlp_proj_w,
                &$($mut)? b.mlp_proj_b,
            ]);
        }
        out.extend([&$($mut)? p.ln_f_gamma, &$($mut)? p.ln_f_beta, &$($mut)? p.lm_head]);
        out
    }};
}

/// Each slot's parameter id and shape (`None` where absent), in [`Params::slots`] order.
pub(crate) fn layout(gpt: &Gpt) -> Vec<Option<(ParamId, Vec<usize>)>> {
    entries(gpt)
        .into_iter()
        .map(|e| e.map(|e| (e.id, e.shape)))
        .collect()
}

impl Params {
    /// The buffers in the order [`entries`] lists the model's parameters.
    pub(crate) fn slots(&self) -> Vec<&Vec<f32>> {
        slots!(self,)
    }

    pub(crate) fn slots_mut(&mut self) -> Vec<&mut Vec<f32>> {
        slots!(self, mut)
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
            .slots()
            .into_iter()
            .zip(layout(&gpt))
            .filter_map(|(slot, entry)| entry.map(|(id, _)| (id, slot.clone())))
            .collect();
        gpt.map(&mut Write(values))
    }

    /// Copies the model's current values (one host read per parameter).
    pub(crate) fn read(gpt: &Gpt) -> Self {
        let mut params = Self {
            blocks: vec![BlockParams::default(); gpt.h.len()],
            ..Self::default()
        };
        for (slot, entry) in params.slots_mut().into_iter().zip(entries(gpt)) {
            *slot = entry.map_or_else(Vec::new, |e| {
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
        for (slot, like) in self.slots_mut().into_iter().zip(like.slots()) {
            slot.clear();
            slot.resize(like.len(), 0.0);
        }
    }

    /// `self += other`, slot by slot.
    pub(crate) fn add(&mut self, other: &Self) {
        for (slot, other) in self.slots_mut().into_iter().zip(other.slots()) {
            slot.iter_mut().zip(other).for_each(|(a, b)| *a += b);
        }
    }

    /// Scales every value by `min(1, max_norm / (‖self‖ + 1e-6))` and returns ‖self‖, the
    /// Euclidean norm of all values together.
    pub(crate) fn scale_to_norm(&mut self, max_norm: f64) -> f64 {
        let squares: f64 = self
            .slots()
            .iter()
            .map(|slot| slot.iter().map(|&g| f64::from(g * g)).sum::<f64>())
            .sum();
        let norm = squares.sqrt();
        let scale = max_norm / (norm + 1e-6);
        if scale < 1.0 {
            for slot in self.slots_mut() {
                slot.iter_mut().for_each(|g| *g *= scale as f32);
            }
        }
        norm
    }

    /// These values as the gradients of `gpt`'s parameters, on the device the optimizer reads
    /// gradients from (the backend under autodiff).
    pub(crate) fn to_gradients(&self, gpt: &Gpt) -> GradientsParams {
        let mut grads = GradientsParams::new();
        for (slot, entry) in self.slots().into_iter().zip(entries(gpt)) {
            let Some(entry) = entry else { continue };
            let device: Device = entry.values.device().inner();
            let flat = Tensor::<1>::from_data(TensorData::new(slot.clone(), [slot.len()]), &device);
            match entry.shape[..] {
                [n] => grads.register(entry.id, flat.reshape([n])),
                [a, b] => grads.register(entry.id, flat.reshape([a, b])),
                _ => unreachable!("GPT parameters are 1-D or 2-D"),
            }
        }
        grads
    }
}
