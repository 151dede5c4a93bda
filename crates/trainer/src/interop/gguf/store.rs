//! Which storage type each tensor of an export gets: as llama.cpp's converter decides it for
//! f32 and f16, as llama.cpp's quantiser (`llama_model_quantize`) does for the quantised types,
//! its per-tensor choice for the `_M` mixes included.

use anyhow::Result;
use tinygpt_model::BlockType;

use super::file::{Tensor, TensorType};
use super::quant::{self, block_type};

/// How an export stores the model's matrices (vectors, norms and biases stay f32, as
/// llama.cpp's converter keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[allow(non_camel_case_types)]
pub enum Dtype {
    F32,
    F16,
    /// ggml's 8-bit blocks of 32 with an f16 scale each; a matrix whose rows are not a
    /// multiple of 32 long stays f16.
    #[value(name = "q8_0")]
    Q8_0,
    /// ggml's 5-bit blocks of 32 with an f16 scale each (rows not a multiple of 32: f16), the
    /// head in Q6_K as llama.cpp's Q5_0 files keep it (unless pure).
    #[value(name = "q5_0")]
    Q5_0,
    /// ggml's 4-bit blocks of 32 with an f16 scale each (rows not a multiple of 32: f16), the
    /// head in Q6_K as llama.cpp's Q4_0 files keep it (unless pure).
    #[value(name = "q4_0")]
    Q4_0,
    /// ggml's 4-bit super-blocks of 256 (a scale and a minimum per 32) for every matrix; rows
    /// not a multiple of 256 long in Q5_0, as llama.cpp falls back.
    #[value(name = "q4_k")]
    Q4_K,
    /// llama.cpp's Q4_K_M mix (Ollama's and LM Studio's usual download): Q4_K, with the head
    /// and a third of the value and down projections in Q6_K, as llama.cpp chooses them.
    #[value(name = "q4_k_m")]
    Q4_K_M,
    /// llama.cpp's Q5_K_M mix: Q5_K, with the same matrices as Q4_K_M's in Q6_K.
    #[value(name = "q5_k_m")]
    Q5_K_M,
    /// ggml's 6-bit super-blocks of 256 (a scale per 16) for every matrix (rows not a
    /// multiple of 256: Q8_0).
    #[value(name = "q6_k")]
    Q6_K,
}

impl Dtype {
    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Q8_0 => 7,
            Dtype::Q5_0 => 8,
            Dtype::Q4_0 => 2,
            Dtype::Q4_K | Dtype::Q4_K_M => 15,
            Dtype::Q5_K_M => 17,
            Dtype::Q6_K => 18,
        }
    }

    /// The name `--dtype` takes.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Q8_0 => "q8_0",
            Dtype::Q5_0 => "q5_0",
            Dtype::Q4_0 => "q4_0",
            Dtype::Q4_K => "q4_k",
            Dtype::Q4_K_M => "q4_k_m",
            Dtype::Q5_K_M => "q5_k_m",
            Dtype::Q6_K => "q6_k",
        }
    }
}

/// The storage of one export's tensors: its `dtype`, for a model of `layers` blocks whose head
/// is the token embedding's (`tied`: llama.cpp then stores `token_embd` as the head); `pure`:
/// every matrix in the dtype's own type, as llama.cpp's quantiser writes with `--pure`, where
/// otherwise it chooses a type per tensor (the head in Q6_K; for the `_M` mixes, more).
#[derive(Debug, Clone, Copy)]
pub struct Types {
    pub dtype: Dtype,
    pub layers: usize,
    pub tied: bool,
    pub pure: bool,
}

impl Types {
    /// The type of the tensor `name` whose rows hold `ne[0]` values (`ne`: GGUF's order).
    fn storage(&self, name: &str, ne: &[u64]) -> TensorType {
        let ne0 = ne[0];
        let quantised = |k: TensorType| fallback(k, ne0);
        match self.dtype {
            _ if ne.len() == 1 => TensorType::F32,
            Dtype::F32 => TensorType::F32,
            Dtype::F16 => TensorType::F16,
            // llama.cpp never quantises a position table.
            _ if name == "position_embd.weight" => TensorType::F32,
            Dtype::Q8_0 | Dtype::Q5_0 | Dtype::Q4_0 if !ne0.is_multiple_of(32) => TensorType::F16,
            // Q8_0 files keep every matrix in Q8_0, the head too.
            Dtype::Q8_0 => TensorType::Q8_0,
            Dtype::Q5_0 => quantised(self.chosen(TensorType::Q5_0, name, ne0)),
            Dtype::Q4_0 => quantised(self.chosen(TensorType::Q4_0, name, ne0)),
            Dtype::Q4_K => quantised(TensorType::Q4_K),
            Dtype::Q4_K_M => quantised(self.chosen(TensorType::Q4_K, name, ne0)),
            Dtype::Q5_K_M => quantised(self.chosen(TensorType::Q5_K, name, ne0)),
            Dtype::Q6_K => quantised(self.chosen(TensorType::Q6_K, name, ne0)),
        }
    }

    /// `base`, or llama.cpp's choice for the tensor where the export is not pure.
    fn chosen(&self, base: TensorType, name: &str, ne0: u64) -> TensorType {
        if self.pure {
            base
        } else {
            self.mixed(base, name, ne0)
        }
    }

    /// llama.cpp's choice for a file of `base` (`llama_tensor_get_type`, for the architectures
    /// tinygpt writes): the head in Q6_K (Q8_0 where its rows are not whole blocks of `base`),
    /// and, for the `_M` mixes (`base` a k-quant), the value (or fused query-key-value) and
    /// down projections of the first and last eighth of the blocks and of every third between
    /// in Q6_K.
    fn mixed(&self, base: TensorType, name: &str, ne0: u64) -> TensorType {
        let head = name == "output.weight" || (self.tied && name == "token_embd.weight");
        if head {
            let whole = ne0.is_multiple_of(base.block().0 as u64);
            return if whole {
                TensorType::Q6_K
            } else {
                TensorType::Q8_0
            };
        }
        let layer = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        let more = matches!(base, TensorType::Q4_K | TensorType::Q5_K)
            && (name.ends_with("attn_v.weight")
                || name.ends_with("attn_qkv.weight")
                || name.ends_with("ffn_down.weight"))
            && layer.is_some_and(|i| use_more_bits(i, self.layers));
        if more { TensorType::Q6_K } else { base }
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// `kind`, or llama.cpp's fallback where a row of `ne0` is not whole blocks of it (f16 where
/// it is not whole blocks of that either).
fn fallback(kind: TensorType, ne0: u64) -> TensorType {
    let fits = |k: TensorType| ne0.is_multiple_of(k.block().0 as u64);
    if fits(kind) {
        return kind;
    }
    let back = block_type(kind)
        .and_then(BlockType::fallback)
        .map(tensor_type);
    back.filter(|&k| fits(k)).unwrap_or(TensorType::F16)
}

/// The GGUF type of the decoder's block type.
fn tensor_type(kind: BlockType) -> TensorType {
    match kind {
        BlockType::Q8_0 => TensorType::Q8_0,
        BlockType::Q5_0 => TensorType::Q5_0,
        BlockType::Q4_0 => TensorType::Q4_0,
        BlockType::Q4_1 => TensorType::Q4_1,
        BlockType::Q5_1 => TensorType::Q5_1,
        BlockType::Q4_K => TensorType::Q4_K,
        BlockType::Q5_K => TensorType::Q5_K,
        BlockType::Q6_K => TensorType::Q6_K,
    }
}

/// A tensor named `name` of row-major `shape` (`[rows, cols]`, PyTorch's order) and f32
/// `values`, stored as `types` says for its name and shape.
pub fn tensor(name: String, shape: &[usize], values: &[f32], types: &Types) -> Result<Tensor> {
    let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    let kind = types.storage(&name, &ne);
    Ok(Tensor {
        name,
        data: quant::encode(values, kind)?,
        ne,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(dtype: Dtype, layers: usize, tied: bool) -> Types {
        Types {
            dtype,
            layers,
            tied,
            pure: false,
        }
    }

    /// llama.cpp's Q4_K_M for 24 layers of width 2048 (SmolLM2-1.7B's shape): Q6_K for the head
    /// and the value and down projections of layers 0–2, 21–23 and every third between, Q4_K
    /// for the rest; at width 576 (the 135M's) the fallbacks.
    #[test]
    fn the_m_mixes_choose_as_llama_cpp() {
        let t = types(Dtype::Q4_K_M, 24, true);
        let more: Vec<usize> = (0..24)
            .filter(|l| {
                t.storage(&format!("blk.{l}.attn_v.weight"), &[2048, 2048]) == TensorType::Q6_K
            })
            .collect();
        assert_eq!(more, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
        assert_eq!(
            t.storage("blk.5.ffn_down.weight", &[8192, 2048]),
            TensorType::Q6_K
        );
        assert_eq!(
            t.storage("blk.4.ffn_down.weight", &[8192, 2048]),
            TensorType::Q4_K
        );
        assert_eq!(
            t.storage("blk.3.attn_q.weight", &[2048, 2048]),
            TensorType::Q4_K
        );
        assert_eq!(
            t.storage("token_embd.weight", &[2048, 49152]),
            TensorType::Q6_K
        );
        assert_eq!(
            t.storage("token_embd.weight", &[576, 49152]),
            TensorType::Q8_0
        );
        assert_eq!(
            t.storage("blk.3.attn_q.weight", &[576, 576]),
            TensorType::Q5_0
        );
        assert_eq!(
            t.storage("blk.0.attn_v.weight", &[576, 192]),
            TensorType::Q8_0
        );
        assert_eq!(t.storage("blk.0.attn_norm.weight", &[576]), TensorType::F32);
        // Untied: the embedding is an ordinary matrix, the head Q6_K.
        let t = types(Dtype::Q5_K_M, 24, false);
        assert_eq!(
            t.storage("token_embd.weight", &[2048, 49152]),
            TensorType::Q5_K
        );
        assert_eq!(t.storage("output.weight", &[2048, 49152]), TensorType::Q6_K);
        assert_eq!(
            t.storage("blk.3.attn_k.weight", &[576, 192]),
            TensorType::Q5_1
        );
        // Every matrix in the type, whatever its place.
        let t = types(Dtype::Q4_K, 24, true);
        assert_eq!(
            t.storage("blk.0.attn_v.weight", &[2048, 256]),
            TensorType::Q4_K
        );
        assert_eq!(
            t.storage("token_embd.weight", &[2048, 49152]),
            TensorType::Q4_K
        );
        let t = types(Dtype::Q6_K, 2, false);
        assert_eq!(
            t.storage("blk.1.ffn_up.weight", &[96, 256]),
            TensorType::Q8_0
        );
        assert_eq!(
            t.storage("blk.1.ffn_up.weight", &[100, 256]),
            TensorType::F16
        );
        assert_eq!(
            t.storage("position_embd.weight", &[256, 64]),
            TensorType::F32
        );
    }

    /// llama.cpp's Q4_0 and Q5_0 files keep the head in Q6_K (Q8_0 where its rows are not whole
    /// super-blocks: the 135M's 576), every other matrix in the file's type; `--pure` keeps
    /// the head in it too, and makes the `_M` mixes every matrix their base type.
    #[test]
    fn the_4_and_5_bit_files_keep_the_head_as_llama_cpp_does_unless_pure() {
        for (dtype, base) in [
            (Dtype::Q4_0, TensorType::Q4_0),
            (Dtype::Q5_0, TensorType::Q5_0),
        ] {
            let mut t = types(dtype, 30, true);
            assert_eq!(
                t.storage("token_embd.weight", &[2048, 49152]),
                TensorType::Q6_K
            );
            assert_eq!(
                t.storage("token_embd.weight", &[576, 49152]),
                TensorType::Q8_0
            );
            for name in [
                "blk.0.attn_v.weight",
                "blk.29.ffn_down.weight",
                "blk.4.attn_q.weight",
            ] {
                assert_eq!(t.storage(name, &[576, 576]), base, "{name}");
            }
            t.pure = true;
            assert_eq!(t.storage("token_embd.weight", &[576, 49152]), base);
            t.tied = false;
            t.pure = false;
            assert_eq!(t.storage("token_embd.weight", &[576, 49152]), base);
            assert_eq!(t.storage("output.weight", &[576, 49152]), TensorType::Q8_0);
            assert_eq!(t.storage("output.weight", &[100, 49152]), TensorType::F16);
        }
        let mut t = types(Dtype::Q8_0, 30, true);
        assert_eq!(
            t.storage("token_embd.weight", &[2048, 49152]),
            TensorType::Q8_0
        );
        t.tied = false;
        assert_eq!(t.storage("output.weight", &[2048, 49152]), TensorType::Q8_0);
        let mut t = types(Dtype::Q5_K_M, 24, false);
        t.pure = true;
        for name in [
            "output.weight",
            "blk.0.attn_v.weight",
            "blk.23.ffn_down.weight",
        ] {
            assert_eq!(t.storage(name, &[2048, 2048]), TensorType::Q5_K, "{name}");
        }
        assert_eq!(
            t.storage("blk.3.attn_k.weight", &[576, 192]),
            TensorType::Q5_1
        );
    }
}
