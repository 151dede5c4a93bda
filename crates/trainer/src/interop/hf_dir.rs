//! A Hugging Face model directory as `save_pretrained` writes it, read the same way for every
//! architecture: `config.json` as the architecture's config, the tokenizer, and the weights
//! (one `model.safetensors`, the shards `model.safetensors.index.json` lists, or one
//! `pytorch_model.bin`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde::de::DeserializeOwned;

use super::foreign::{Foreign, deferred_safetensors, read_pytorch};
use crate::data::tokenizer::Tokenizer;
use crate::run::streamed::Deferred;

/// `dir`'s `config.json` (already read as `config`) as the config of `architecture` ("GPT-2",
/// "Llama"), or a line naming the file.
pub(super) fn config<T: DeserializeOwned>(
    dir: &Path,
    config: serde_json::Value,
    architecture: &str,
) -> Result<T> {
    serde_json::from_value(config).map_err(|e| {
        let path = dir.join("config.json");
        anyhow!("{}: not a {architecture} config ({e})", path.display())
    })
}

/// The tokenizer at `tokenizer`, else `dir`'s `tokenizer.json`.
pub(super) fn tokenizer(dir: &Path, tokenizer: Option<&Path>) -> Result<Tokenizer> {
    let path = tokenizer.map_or_else(|| dir.join("tokenizer.json"), Path::to_path_buf);
    if !path.exists() {
        bail!(
            "{} has no tokenizer.json (save it with tokenizer.save_pretrained, or pass --tokenizer)",
            dir.display()
        );
    }
    Tokenizer::from_hf_file(&path)
}

/// A directory's weights: every tensor under the name the file gives it, read from the file
/// when it is made (a safetensors file's; a PyTorch file's are read at once).
pub(super) struct Weights {
    /// What errors name: the one weights file, or the shards' index.
    pub source: PathBuf,
    pub tensors: BTreeMap<String, Deferred<'static>>,
}

impl Weights {
    /// Every tensor, read now.
    pub(super) fn made(self) -> Result<BTreeMap<String, Foreign>> {
        super::foreign::made(self.tensors)
    }
}

/// Every tensor of `dir`'s weights: `model.safetensors`, the shards its
/// `model.safetensors.index.json` lists, or `pytorch_model.bin`.
pub(super) fn weights(dir: &Path) -> Result<Weights> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let bin = dir.join("pytorch_model.bin");
    let (source, tensors) = if single.exists() {
        let tensors = deferred_safetensors(&single)?;
        (single, tensors)
    } else if index.exists() {
        let tensors = shards(dir, &index)?;
        (index, tensors)
    } else if bin.exists() {
        let read = read_pytorch(&bin, None)?.into_iter();
        let tensors = read.map(|(name, t)| (name, Deferred::ready(t.shape, t.values)));
        (bin, tensors.collect())
    } else if dir.join("pytorch_model.bin.index.json").exists() {
        bail!(
            "{} holds a sharded PyTorch checkpoint, which tinygpt does not read; save it with \
             save_pretrained(..., safe_serialization=True)",
            dir.display()
        )
    } else {
        bail!(
            "{} has neither model.safetensors, model.safetensors.index.json nor pytorch_model.bin",
            dir.display()
        )
    };
    Ok(Weights { source, tensors })
}

/// Every tensor of the shards `index` lists (in `dir`), each tensor the index names present.
fn shards(dir: &Path, index_path: &Path) -> Result<BTreeMap<String, Deferred<'static>>> {
    let text = std::fs::read_to_string(index_path)
        .with_context(|| format!("cannot read {}", index_path.display()))?;
    let index: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is invalid ({e})", index_path.display()))?;
    let map = index
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| anyhow!("{} has no weight_map", index_path.display()))?;
    let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
    shards.sort_unstable();
    shards.dedup();
    let mut tensors = BTreeMap::new();
    for shard in shards {
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            bail!(
                "{}: shard name {shard:?} leaves the directory",
                index_path.display()
            );
        }
        tensors.extend(deferred_safetensors(&dir.join(shard))?);
    }
    if let Some(name) = map.keys().find(|name| !tensors.contains_key(*name)) {
        bail!("{}: tensor `{name}` is in no shard", index_path.display());
    }
    Ok(tensors)
}
