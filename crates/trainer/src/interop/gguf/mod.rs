//! GGUF, the file llama.cpp, Ollama and LM Studio run models from: `tinygpt export --format
//! gguf` writes one, `tinygpt import --from FILE.gguf` reads one.
//!
//! - [`file`]: the container (metadata, tensor table, aligned data), written and read.
//! - [`quant`]: f32 values as F32, F16, BF16 and ggml's `Q8_0` blocks, and back.
//! - [`bpe`]: a byte-level BPE tokenizer (char vocabularies included) as `tokenizer.*`
//!   metadata (llama.cpp's `gpt2` model) and back; `pre`: llama.cpp's pre-tokenizers by name,
//!   both ways; `spm`: a SentencePiece vocabulary both ways, as llama.cpp cuts text;
//!   `vocabulary`: which of the two a tokenizer or a file is, and the metadata both share.
//! - [`store`]: which storage type each tensor of an export gets (`--dtype`).
//! - [`architecture`]: which llama.cpp architecture computes a model, by config or by name,
//!   and what it approximates; [`difference`]: what an export changes, measured.
//! - [`gpt2`]: GPT-2-shaped models as llama.cpp's `gpt2` architecture.
//! - [`llama`]: rotary + RMSNorm + SwiGLU models as llama.cpp's `llama` architecture (with
//!   QK-norm as `qwen3`, with ReLU² as `arcee`).
//! - [`import`]: a `gpt2` or `llama` file as a run directory; [`kept`]: the types its
//!   matrices were stored in, kept with the run for `--weights file`.
//!
//! The container is small enough to own: reading it checks every count, length and offset
//! against the bytes there, which the Rust GGUF crates we read did not all promise for files
//! from elsewhere.

mod architecture;
pub mod bpe;
mod difference;
pub mod file;
mod gpt2;
mod import;
pub mod kept;
mod llama;
mod pre;
pub mod quant;
pub(crate) mod spm;
mod store;
mod vocabulary;

use std::path::Path;

use anyhow::{Result, bail};

pub use architecture::{Approximation, Architecture};
pub use difference::Report;
pub use file::{Gguf, Tensor, TensorType, Value};
pub use import::import;
pub use store::Dtype;

use super::chat_files;
use crate::run::checkpoint::{Run, Which};

/// What an export wrote, for the user.
pub struct Written {
    pub architecture: &'static str,
    pub tensors: usize,
    pub bytes: usize,
    /// How many matrices the file stores in each type, as "Q4_0 ×28, Q6_K ×1".
    pub matrices: String,
    /// What the file changes in what the model computes.
    pub report: Report,
}

/// Writes the run's `which` weights to the new file `out` as `dtype` (`pure`: every matrix in
/// its type, where llama.cpp would choose per tensor), and measures what the file changes (a
/// part llama.cpp approximates, f16 or q8_0 matrices). Refuses, before writing anything, a
/// model llama.cpp cannot compute, and an `out` that exists.
pub fn export(
    run: &Run,
    which: Which,
    (dtype, pure): (Dtype, bool),
    out: &Path,
) -> Result<Written> {
    let config = run.config.gpt(run.tokenizer.vocab_size());
    let (architecture, approximations) = Architecture::of(&config)?;
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
    let mut metadata = vec![
        (
            "general.architecture".into(),
            Value::Str(architecture.name().into()),
        ),
        ("general.name".into(), Value::Str(name)),
        ("general.file_type".into(), Value::U32(dtype.file_type())),
        ("general.quantization_version".into(), Value::U32(2)),
    ];
    // llama's tied head is no tensor of its own (gpt2's is written as `output.weight`).
    let types = store::Types {
        dtype,
        layers: config.n_layer,
        tied: config.tie_embeddings && architecture != Architecture::Gpt2,
        pure,
    };
    let tensors = match architecture {
        Architecture::Gpt2 => {
            metadata.extend(gpt2::hparams(&config));
            gpt2::tensors(&config, &model, &types)?
        }
        Architecture::Llama(flavour) => {
            metadata.extend(llama::hparams(&config, flavour));
            llama::tensors(&config, &model, &types, flavour)?
        }
    };
    metadata.extend(vocabulary::entries(
        &run.tokenizer,
        config.vocab_size,
        template,
    )?);
    let mut gguf = Gguf { metadata, tensors };
    // GGUF names one end-of-turn token besides EOS: the first stop token that is not EOS.
    let stops: Vec<u64> = match &generation["eos_token_id"] {
        serde_json::Value::Array(ids) => ids.iter().filter_map(|id| id.as_u64()).collect(),
        one => one.as_u64().into_iter().collect(),
    };
    let eos = run.tokenizer.end_of_text().map(u64::from);
    if let Some(&eot) = stops.iter().find(|&&id| Some(id) != eos) {
        gguf.metadata.push((
            "tokenizer.ggml.eot_token_id".into(),
            Value::U32(u32::try_from(eot)?),
        ));
    }
    let bytes = gguf.to_bytes()?;
    crate::fs::write_atomic(out, &bytes)?;
    // The file is written: its bytes are not held while the export measures it.
    let size = bytes.len();
    drop(bytes);
    let file = difference::FileAs {
        gguf: &gguf,
        dtype,
        fused_qkv: architecture == Architecture::Gpt2,
        interleaved: architecture.interleaves(),
    };
    let report = difference::measure(run, &model, &config, &approximations, file);
    let matrices = gguf.tensors.iter().filter(|t| t.ne.len() > 1);
    let matrices = kept::counted(matrices.map(|t| t.kind.name()));
    Ok(Written {
        architecture: architecture.name(),
        tensors: gguf.tensors.len(),
        bytes: size,
        matrices,
        report,
    })
}
