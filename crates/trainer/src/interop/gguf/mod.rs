//! GGUF, the file llama.cpp, Ollama and LM Studio run models from: `tinygpt export --format
//! gguf` writes one.
//!
//! - [`file`]: the container (metadata, tensor table, aligned data), written and read.
//! - [`quant`]: f32 values as F32, F16, BF16 and ggml's `Q8_0` blocks, and back.
//! - [`vocab`]: the run's tokenizer as `tokenizer.*` metadata (byte-level BPE, char vocabularies
//!   included).
//! - [`gpt2`]: GPT-2-shaped models as llama.cpp's `gpt2` architecture.
//!
//! The container is small enough to own: reading it checks every count, length and offset
//! against the bytes there, which the Rust GGUF crates we read did not all promise for files
//! from elsewhere.

pub mod file;
mod gpt2;
pub mod quant;
pub mod vocab;

use std::path::Path;

use anyhow::{Result, bail};

pub use file::{Gguf, Tensor, TensorType, Value};

use super::chat_files;
use crate::run::checkpoint::{Run, Which};

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
}

impl Dtype {
    /// The storage of a tensor whose rows hold `ne0` values, `dims` dimensions in all.
    fn storage(self, ne0: u64, dims: usize) -> TensorType {
        match (self, dims) {
            (_, 1) | (Dtype::F32, _) => TensorType::F32,
            (Dtype::F16, _) => TensorType::F16,
            (Dtype::Q8_0, _) if ne0.is_multiple_of(quant::Q8_0_BLOCK as u64) => TensorType::Q8_0,
            (Dtype::Q8_0, _) => TensorType::F16,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    fn file_type(self) -> u32 {
        match self {
            Dtype::F32 => 0,
            Dtype::F16 => 1,
            Dtype::Q8_0 => 7,
        }
    }
}

/// What an export wrote, for the user.
pub struct Written {
    pub architecture: &'static str,
    pub tensors: usize,
    pub bytes: usize,
}

/// Writes the run's `which` weights to the new file `out` as `dtype`. Refuses, before writing
/// anything, a model llama.cpp cannot compute exactly, and an `out` that exists.
pub fn export(run: &Run, which: Which, dtype: Dtype, out: &Path) -> Result<Written> {
    let config = run.config.gpt(run.tokenizer.vocab_size());
    gpt2::expressible(&config).map_err(|part| {
        anyhow::anyhow!(
            "GGUF export writes llama.cpp's gpt2 architecture, which cannot compute a model \
             {part}"
        )
    })?;
    if out.exists() {
        bail!(
            "{} exists; choose another --out (export never overwrites a file)",
            out.display()
        );
    }
    let (model, _) = run.load_model(which, &burn::tensor::Device::flex())?;
    let (tokenizer_config, generation) = chat_files::for_export(&run.config.chat, &run.tokenizer);
    let template = tokenizer_config["chat_template"].as_str();
    let name = run
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tinygpt".into());
    let mut metadata = gpt2::hparams(&config, &name, dtype);
    metadata.extend(vocab::metadata(
        &run.tokenizer,
        config.vocab_size,
        template,
    )?);
    let mut gguf = Gguf {
        metadata,
        tensors: gpt2::tensors(&config, &model, dtype)?,
    };
    if let Some(eot) = generation["eos_token_id"].as_u64() {
        let eot = u32::try_from(eot)?;
        if Some(eot) != run.tokenizer.end_of_text() {
            gguf.metadata
                .push(("tokenizer.ggml.eot_token_id".into(), Value::U32(eot)));
        }
    }
    let bytes = gguf.to_bytes()?;
    crate::fs::write_atomic(out, &bytes)?;
    Ok(Written {
        architecture: "gpt2",
        tensors: gguf.tensors.len(),
        bytes: bytes.len(),
    })
}

/// A tensor named `name` of row-major `shape` (`[rows, cols]`, PyTorch's order) and f32
/// `values`, stored as `dtype` says for its shape.
fn tensor(name: String, shape: &[usize], values: &[f32], dtype: Dtype) -> Tensor {
    let ne: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
    let kind = dtype.storage(ne[0], ne.len());
    Tensor {
        name,
        data: quant::encode(values, kind),
        ne,
        kind,
    }
}
