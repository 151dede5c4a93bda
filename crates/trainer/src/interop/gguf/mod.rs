//! GGUF, the file llama.cpp, Ollama and LM Studio run models from: `tinygpt export --format
//! gguf` writes one.
//!
//! - [`file`]: the container (metadata, tensor table, aligned data), written and read.
//! - [`quant`]: f32 values as F32, F16, BF16 and ggml's `Q8_0` blocks, and back.
//! - [`vocab`]: the run's tokenizer as `tokenizer.*` metadata (byte-level BPE, char vocabularies
//!   included).
//! - [`store`]: which storage type each tensor of an export gets (`--dtype`).
//! - [`gpt2`]: GPT-2-shaped models as llama.cpp's `gpt2` architecture.
//!
//! The container is small enough to own: reading it checks every count, length and offset
//! against the bytes there, which the Rust GGUF crates we read did not all promise for files
//! from elsewhere.

pub mod file;
mod gpt2;
pub mod quant;
mod store;
pub mod vocab;

use std::path::Path;

use anyhow::{Result, bail};

pub use file::{Gguf, Tensor, TensorType, Value};
pub use store::Dtype;

use super::chat_files;
use crate::run::checkpoint::{Run, Which};

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
