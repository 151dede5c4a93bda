//! The decoder's weights as int8 (`Q8_0`): each block's four matrices and the LM head, quantised
//! once when the decoder is made. Embeddings, norms, biases and the KV cache stay f32; a
//! matrix whose rows are not whole blocks of 32 stays f32 too (as llama.cpp keeps it).

use crate::arch::Mlp;
use crate::cpu::dims::Dims;
use crate::cpu::error::FusedError;
use crate::cpu::kernels::q8::{BLOCK, Q8Matrix};
use crate::cpu::params::{BlockParams, Params, QuantBlock};
use crate::nn::Gpt;

/// How the fused decoder keeps the weights of its matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// As trained: 4 bytes a weight.
    #[default]
    F32,
    /// GGUF's `Q8_0`: blocks of 32 signed bytes and an f16 scale, 1.0625 bytes a weight; the
    /// activations are quantised per block of 32 on the fly, and the products summed in
    /// integers.
    Q8_0,
}

/// Every block's matrices and the LM head in `Q8_0`.
#[derive(Debug, Clone, Default)]
pub(crate) struct QuantWeights {
    pub blocks: Vec<QuantBlock>,
    pub head: Option<Q8Matrix>,
}

/// `w [n_in, n_out]` as `Q8_0` rows when `n_in` is whole blocks, its f32 buffer then freed.
fn take(w: &mut Vec<f32>, n_in: usize) -> Option<Q8Matrix> {
    if w.is_empty() || !n_in.is_multiple_of(BLOCK) {
        return None;
    }
    let q = Q8Matrix::from_columns(w, n_in);
    *w = Vec::new();
    Some(q)
}

impl QuantWeights {
    /// Quantises `w`'s matrices, leaving f32 only what stays f32 (the tied embedding is kept:
    /// the embedding lookup reads it).
    pub(crate) fn take(w: &mut Params, d: &Dims) -> Self {
        let c = d.width;
        let block = |p: &mut BlockParams| QuantBlock {
            c_attn: take(&mut p.c_attn_w, c),
            attn_proj: take(&mut p.attn_proj_w, c),
            c_fc: take(&mut p.c_fc_w, c),
            mlp_proj: take(&mut p.mlp_proj_w, d.hidden),
        };
        let head = match (w.lm_head.is_empty(), c.is_multiple_of(BLOCK)) {
            (_, false) => None,
            (true, true) => Some(Q8Matrix::from_rows(&w.wte, c)),
            (false, true) => take(&mut w.lm_head, c),
        };
        Self {
            blocks: w.blocks.iter_mut().map(block).collect(),
            head,
        }
    }
}

/// The bytes of weights one token's forward reads in products, every block's matrices and the
/// LM head (the embedding row and the norms left out: they are a row, not a matrix), with the
/// matrices kept in `format`.
pub fn weight_bytes_per_token(gpt: &Gpt, format: WeightFormat) -> Result<usize, FusedError> {
    let d = Dims::of(gpt)?;
    let bytes = |n_in: usize, n_out: usize| match format {
        WeightFormat::Q8_0 if n_in.is_multiple_of(BLOCK) => n_in * n_out / BLOCK * (BLOCK + 2),
        WeightFormat::F32 | WeightFormat::Q8_0 => 4 * n_in * n_out,
    };
    let c = d.width;
    let mlp = match d.mlp {
        Mlp::None => 0,
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => {
            bytes(c, d.fc_width) + bytes(d.hidden, c)
        }
    };
    let block = bytes(c, d.qkv_width()) + bytes(c, c) + mlp;
    Ok(gpt.h.len() * block + bytes(c, d.vocab))
}
