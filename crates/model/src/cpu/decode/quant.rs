//! The decoder's matrices: each block's four and the LM head laid out as rows of outputs once,
//! when the decoder is made, in f32, int8 (`Q8_0`), four bits (`Q4_0`) or five (`Q5_0`),
//! quantised then. Embeddings, norms,
//! biases and the KV cache stay f32; a matrix whose rows are not whole blocks of 32 stays f32
//! too (as llama.cpp keeps it). A tied head stays the embedding's rows, which it already is.

use crate::arch::{GptConfig, Mlp};
use crate::cpu::buffer::Buffer;
use crate::cpu::dims::Dims;
use crate::cpu::kernels::q4_0::Q4Matrix;
use crate::cpu::kernels::q5_0::Q5Matrix;
use crate::cpu::kernels::q8::{BLOCK, Q8Matrix};
use crate::cpu::kernels::rows::F32Rows;
use crate::cpu::params::{BlockParams, Lookup, Params, RowBlock, RowMatrix};

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
    /// GGUF's `Q4_0`: blocks of 32 four-bit values and an f16 scale, 0.5625 bytes a weight,
    /// times the activations quantised as for `Q8_0`.
    Q4_0,
    /// GGUF's `Q5_0`: blocks of 32 five-bit values and an f16 scale, 0.6875 bytes a weight,
    /// times the activations quantised as for `Q8_0` (what llama.cpp's "Q4_K_M" files hold
    /// where rows are not a multiple of 256 long).
    Q5_0,
}

/// Every block's matrices and the LM head as rows.
#[derive(Debug, Clone, Default)]
pub(crate) struct RowWeights {
    pub blocks: Vec<RowBlock>,
    /// `None`: a tied head (the embedding's rows, in f32) or an untied one kept in
    /// [`Params`]' layout.
    pub head: Option<RowMatrix>,
    /// An untied embedding's rows as a file's blocks (`None`: looked up in [`Params`]' f32
    /// values).
    pub embedding: Option<RowMatrix>,
}

impl RowWeights {
    /// Where a token's embedding is looked up besides [`Params`]' f32 values.
    pub(crate) fn lookup(&self) -> Lookup<'_> {
        Lookup {
            own: self.embedding.as_ref(),
            tied_head: self.head.as_ref(),
        }
    }
}

/// `w [n_in, n_out]` as rows in `format` (`Q8_0` only when `n_in` is whole blocks; f32 rows
/// otherwise), its buffer in [`Params`] then freed (`None`: a matrix the model lacks).
fn take(w: &mut Buffer, n_in: usize, format: WeightFormat) -> Option<RowMatrix> {
    let w = w.take(Buffer::Elsewhere)?;
    let rows = match format {
        WeightFormat::Q8_0 if n_in.is_multiple_of(BLOCK) => {
            RowMatrix::Q8(Q8Matrix::from_columns(&w, n_in))
        }
        WeightFormat::Q4_0 if n_in.is_multiple_of(BLOCK) => {
            RowMatrix::Q4(Q4Matrix::from_columns(&w, n_in))
        }
        WeightFormat::Q5_0 if n_in.is_multiple_of(BLOCK) => {
            RowMatrix::Q5(Q5Matrix::from_columns(&w, n_in))
        }
        WeightFormat::F32 | WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 => {
            RowMatrix::F32(F32Rows::from_columns(&w, n_in))
        }
    };
    Some(rows)
}

impl RowWeights {
    /// `w`'s matrices as rows in `format`, leaving in `w` only what stays in its layout (the
    /// embedding: its lookup reads it, and a tied head uses its rows).
    pub(crate) fn take(w: &mut Params, d: &Dims, format: WeightFormat) -> Self {
        let c = d.width;
        let block = |p: &mut BlockParams| RowBlock {
            c_attn: take(&mut p.c_attn_w, c, format),
            attn_proj: take(&mut p.attn_proj_w, c, format),
            c_fc: take(&mut p.c_fc_w, c, format),
            mlp_proj: take(&mut p.mlp_proj_w, d.hidden, format),
        };
        let head = match (&w.lm_head, format, c.is_multiple_of(BLOCK)) {
            (Buffer::Absent, WeightFormat::Q8_0, true) => {
                Some(RowMatrix::Q8(Q8Matrix::from_rows(w.wte.values(), c)))
            }
            (Buffer::Absent, WeightFormat::Q4_0, true) => {
                Some(RowMatrix::Q4(Q4Matrix::from_rows(w.wte.values(), c)))
            }
            (Buffer::Absent, WeightFormat::Q5_0, true) => {
                Some(RowMatrix::Q5(Q5Matrix::from_rows(w.wte.values(), c)))
            }
            (Buffer::Absent, _, _) => None,
            (_, _, _) => take(&mut w.lm_head, c, format),
        };
        Self {
            blocks: w.blocks.iter_mut().map(block).collect(),
            head,
            embedding: None,
        }
    }
}

/// The bytes of weights one token's forward reads in products for a model of `config`, every
/// block's matrices and the LM head (the embedding row and the norms left out: they are a row,
/// not a matrix), with the matrices kept in `format`. Counted from the config: nothing is
/// built.
pub fn weight_bytes_per_token(config: &GptConfig, format: WeightFormat) -> usize {
    let d = Dims::from_config(config);
    let bytes = |n_in: usize, n_out: usize| match format {
        WeightFormat::Q8_0 if n_in.is_multiple_of(BLOCK) => n_in * n_out / BLOCK * (BLOCK + 2),
        WeightFormat::Q4_0 if n_in.is_multiple_of(BLOCK) => n_in * n_out / BLOCK * (BLOCK / 2 + 2),
        WeightFormat::Q5_0 if n_in.is_multiple_of(BLOCK) => n_in * n_out / BLOCK * (BLOCK / 2 + 6),
        WeightFormat::F32 | WeightFormat::Q8_0 | WeightFormat::Q4_0 | WeightFormat::Q5_0 => {
            4 * n_in * n_out
        }
    };
    let c = d.width;
    let mlp = match d.mlp {
        Mlp::None => 0,
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => {
            bytes(c, d.fc_width) + bytes(d.hidden, c)
        }
    };
    let block = bytes(c, d.qkv_width()) + bytes(c, c) + mlp;
    config.n_layer * block + bytes(c, d.vocab)
}
