//! Which storage type each tensor of an export gets, as llama.cpp's converter decides it.

use anyhow::Result;

use super::file::{Tensor, TensorType};
use super::quant;

/// How an export stores the model's matrices (vectors, norms and biases stay f32, as
/// llama.cpp's converter keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Dtype {
    F32,
    F16,
    /// ggml's 8-bit blocks of 32 with an f16 scale each; a matrix whose rows are not a
    /// multiple of 32 long stays f16.
    #[value(name = "q8_0")]
    Q8_0,
    /// ggml's 5-bit blocks of 32 with an f16 scale each (rows not a multiple of 32: f16).
    #[value(name = "q5_0")]
    Q5_0,
    /// ggml's 4-bit blocks of 32 with an f16 scale each (rows not a multiple of 32: f16).
    #[value(name = "q4_0")]
    Q4_0,
}

impl Dtype {
    /// The storage of a tensor whose rows hold `ne0` values, `dims` dimensions in all.
    fn storage(self, ne0: u64, dims: usize) -> TensorType {
        match (self, dims) {
            (_, 1) | (Dtype::F32, _) => TensorType::F32,
            (Dtype::F16, _) => TensorType::F16,
            (Dtype::Q8_0 | Dtype::Q5_0 | Dtype::Q4_0, _)
                if !ne0.is_multiple_of(quant::Q8_0_BLOCK as u64) =>
            {
                TensorType::F16
            }
            (Dtype::Q8_0, _) => TensorType::Q8_0,
            (Dtype::Q5_0, _) => TensorType::Q5_0,
            (Dtype::Q4_0, _) => TensorType::Q4_0,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Q8_0 => 7,
            Dtype::Q5_0 => 8,
            Dtype::Q4_0 => 2,
        }
    }
}

/// A tensor named `name` of row-major `shape` (`[rows, cols]`, PyTorch's order) and f32
/// `values`, stored as `dtype` says for its shape.
pub fn tensor(name: String, shape: &[usize], values: &[f32], dtype: Dtype) -> Result<Tensor> {
    let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    let kind = dtype.storage(ne[0], ne.len());
    Ok(Tensor {
        name,
        data: quant::encode(values, kind)?,
        ne,
        kind,
    })
}
