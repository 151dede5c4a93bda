//! A LoRA run's checkpoint file: the adapters' factors (megabytes, not a copy of the model),
//! and the parts of the base trained beside them (`[lora] also_train`), Burn's paths as names
//! (`h.0.attn.c_attn.weight.lora.a`, `wte.weight`). The base they apply to is named in
//! `state.json` ([`LoraBase`](super::checkpoint::LoraBase)).

use std::path::Path;

use anyhow::{Result, bail};
use burn::store::{ModuleSnapshot, SafetensorsStore};
use tinygpt_model::{Gpt, GptConfig, LoraConfig, names::TrainedPart, names::trained_beside};

/// The tensors of a LoRA checkpoint: the adapters' factors, `….weight.lora.a` and `.b`.
const ADAPTERS: &str = r"\.lora\.[ab]$";

/// Burn's paths of the parts of a model of `config` that `parts` train in full.
fn trained_paths(config: &GptConfig, parts: &[TrainedPart]) -> Vec<String> {
    let trained = trained_beside(config, parts).into_iter();
    trained.map(|p| p.burn).collect()
}

/// `model` with the adapters of `lora` attached and their factors, and the parts of the base
/// it trains, read from a LoRA checkpoint's safetensors `bytes`: every one present, nothing
/// else in the file.
pub(crate) fn attach_adapters(model: Gpt, lora: &LoraConfig, bytes: Vec<u8>) -> Result<Gpt> {
    let mut model = model.with_lora(lora)?;
    let trained = trained_paths(model.config(), &lora.also_train);
    let mut store = SafetensorsStore::from_bytes(Some(bytes))
        .with_regex(ADAPTERS)
        .with_full_paths(trained.clone())
        .allow_partial(true)
        .validate(false);
    let result = model
        .load_from(&mut store)
        .map_err(|e| anyhow::anyhow!("the adapters are not valid safetensors ({e})"))?;
    if let Some(error) = result.errors.first() {
        bail!("{error}");
    }
    if let Some((path, _)) = result.missing.iter().find(|(p, _)| p.contains(".lora.")) {
        bail!("adapter `{path}` is missing (another [lora] rank or targets?)");
    }
    if let Some((path, _)) = result.missing.iter().find(|(p, _)| trained.contains(p)) {
        bail!("`{path}`, trained beside the adapters, is missing (another [lora] also_train?)");
    }
    if let Some(path) = result.unused.first() {
        bail!("unexpected tensor `{path}` (another [lora] rank or targets?)");
    }
    model.check_config()?;
    Ok(model)
}

/// Writes `model`'s adapters' factors and the parts of its base trained beside them to
/// `path`, a tensor at a time, and syncs it.
pub(crate) fn write_adapters(model: &Gpt, path: &Path) -> Result<()> {
    let trained = trained_paths(model.config(), model.lora_also_train());
    let mut store = SafetensorsStore::from_file(path)
        .overwrite(true)
        .with_regex(ADAPTERS)
        .with_full_paths(trained);
    model
        .save_into(&mut store)
        .map_err(|e| anyhow::anyhow!("cannot write the adapters to {}: {e}", path.display()))?;
    std::fs::File::open(path)
        .and_then(|file| file.sync_all())
        .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
}
