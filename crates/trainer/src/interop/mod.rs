//! `tinygpt import` / `tinygpt export`: models in and out of the formats other GPT code uses.
//!
//! - [`nanogpt`]: nanoGPT's `ckpt.pt` (a PyTorch zip-pickle: `model`, `model_args`, …) and its
//!   `meta.pkl` char maps, read without Python.
//! - [`hf`]: Hugging Face GPT-2 directories, read and written.
//! - [`llama`]: Hugging Face Llama-family directories (`LlamaForCausalLM`: SmolLM2, TinyLlama),
//!   read and written.
//! - [`hf_dir`]: what both read of a Hugging Face directory: `config.json`, `tokenizer.json`,
//!   and the weights (`model.safetensors`, its shards, or `pytorch_model.bin`).
//! - [`sidecar`]: tinygpt's own exchange file, nanoGPT-named safetensors plus a JSON sidecar.
//! - [`gguf`]: llama.cpp's GGUF (its `gpt2` and `llama` architectures), read and written.
//! - [`peft`]: PEFT's LoRA adapter directories, for a base run, read and written.
//!
//! All three name tensors as nanoGPT does; [`weights`] maps those names onto the model crate's
//! parameter table and checks every shape against the model the imported config describes.
//! An import builds a complete run directory or nothing.

mod chat_files;
pub mod foreign;
pub mod gguf;
pub mod hf;
mod hf_dir;
pub mod llama;
pub mod nanogpt;
pub mod peft;
mod run;
pub mod sidecar;

use std::path::Path;

use anyhow::{Context, Result, bail};

pub use run::{ImportOptions, Imported};
pub use sidecar::{export, sidecar_path};

use crate::run::checkpoint::{self};

/// Imports `options.from` into a new run directory `out`: `best` and `last` both hold the
/// imported weights, with no optimizer state.
pub fn import(options: &ImportOptions, out: &Path) -> Result<Imported> {
    checkpoint::refuse_existing(out)?;
    let from = &options.from;
    if !from.exists() {
        bail!("{} does not exist", from.display());
    }
    if options.base.is_some() && !(from.is_dir() && peft::is_adapter(from)) {
        bail!("--base goes with a PEFT adapter directory (adapter_config.json)");
    }
    if from.is_dir() && peft::is_adapter(from) {
        let Some(base) = &options.base else {
            bail!(
                "{} is a PEFT adapter: name the run it adapts with --base RUN (its base model, \
                 imported with `tinygpt import`)",
                from.display()
            );
        };
        if options.meta.is_some() || options.tokenizer.is_some() || options.block_size.is_some() {
            bail!(
                "a PEFT adapter takes its base's tokenizer and context: drop --meta, --tokenizer and --block-size"
            );
        }
        return peft::import(from, base, out);
    }
    if from.is_dir() {
        if options.meta.is_some() {
            bail!("--meta goes with a nanoGPT ckpt.pt, not a Hugging Face directory");
        }
        let config = hf_config(from)?;
        if llama::is_llama(&config) {
            let tokenizer = options.tokenizer.as_deref();
            return llama::import(from, config, tokenizer, options.block_size, out);
        }
        if options.block_size.is_some() {
            bail!(
                "--block-size goes with a Llama-family directory (GPT-2's positions are a table)"
            );
        }
        return hf::import(from, config, options.tokenizer.as_deref(), out);
    }
    if from.extension().is_some_and(|e| e == "gguf") || is_gguf(from) {
        return gguf::import(from, options, out);
    }
    if options.block_size.is_some() {
        bail!("--block-size goes with a Llama-family directory or a GGUF file");
    }
    if from.extension().is_some_and(|e| e == "safetensors") {
        if !sidecar_path(from).exists() {
            bail!(
                "{} has no sidecar {} (written by `tinygpt export`); for a Hugging Face model, \
                 pass its directory",
                from.display(),
                sidecar_path(from).display()
            );
        }
        if options.meta.is_some() || options.tokenizer.is_some() {
            bail!(
                "--meta and --tokenizer go with a nanoGPT ckpt.pt; the sidecar holds the tokenizer"
            );
        }
        return sidecar::import(from, out);
    }
    nanogpt::import(from, options, out)
}

/// Whether the file `path` starts with GGUF's magic number.
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}

/// The `config.json` of the Hugging Face directory `dir`, as JSON.
fn hf_config(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} is not a Hugging Face model directory: cannot read config.json",
            dir.display()
        )
    })?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{} is invalid ({e})", path.display()))
}
