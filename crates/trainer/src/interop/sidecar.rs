//! tinygpt's exchange file (`export --format nanogpt`): weights under nanoGPT's names and
//! PyTorch's layout in `FILE.safetensors`, nanoGPT's config (with tinygpt's parts and norm ε
//! beside it) and tokenizer maps in `FILE.json`.
//!
//! nanoGPT's `state_dict` names every tensor `transformer.…` (or `lm_head.weight`) and stores a
//! `Linear` weight as `[out, in]`; Burn's `Linear` keeps `[in, out]` and its LayerNorm calls the
//! scale and shift `gamma` and `beta`. The model crate's [`parameter_table`] pairs the two namings; export walks
//! it one way, import the other, and both check every shape and dtype against the model that the
//! config describes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use tinygpt_model::GptConfig;
use tinygpt_model::parts::{Mlp, Norm, Position, ProjInit};

use super::foreign::{ForeignTensors, Layout, burn_tensors, present, transpose, write_safetensors};
use super::run::{Imported, create_run, imported_config};
use crate::chat::ChatSection;
use crate::data::tokenizer::Tokenizer;
use crate::run::checkpoint::{Run, Which};

/// The sidecar JSON: nanoGPT's `GPTConfig` fields and its `meta.pkl` maps.
#[derive(Serialize, Deserialize)]
struct Sidecar {
    config: NanoGptConfig,
    /// `char`: nanoGPT's `stoi` / `itos`; `bpe`: Hugging Face tokenizer JSON.
    tokenizer: serde_json::Value,
    /// The run's `[chat]`: its chat template (absent when it has none, and in older sidecars).
    #[serde(default, skip_serializing_if = "ChatSection::is_default")]
    chat: ChatSection,
}

/// nanoGPT's `GPTConfig`: `vocab_size` is the model's embedding rows (nanoGPT pads GPT-2's
/// 50257 tokens to 50304), which may exceed the tokenizer's. Then what nanoGPT's model fixes and
/// tinygpt's may change (absent in older sidecars: nanoGPT's values).
#[derive(Serialize, Deserialize)]
struct NanoGptConfig {
    block_size: usize,
    vocab_size: usize,
    n_layer: usize,
    n_head: usize,
    n_embd: usize,
    dropout: f64,
    bias: bool,
    #[serde(default = "nanogpt_eps")]
    layer_norm_eps: f64,
    /// The parts ([`tinygpt_model::parts`]); absent in older sidecars: nanoGPT's.
    #[serde(default)]
    position: Position,
    #[serde(default)]
    norm: Norm,
    /// Absent in older sidecars, which wrote `activation` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mlp: Option<Mlp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// The MLP's nonlinearity, under the name of its part (`gelu_tanh`, ...).
    activation: Option<Mlp>,
    /// 0 (absent in older sidecars) = none.
    #[serde(default)]
    logit_softcap: f64,
    /// The attention's parts and the MLP's width (absent in older sidecars: nanoGPT's).
    #[serde(default = "default_rope_theta")]
    rope_theta: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    n_kv_head: Option<usize>,
    #[serde(default)]
    qk_norm: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mlp_hidden: Option<usize>,
    #[serde(default)]
    proj_init: ProjInit,
    /// The bigram table (`transformer.bigram.weight`); absent in older sidecars: none.
    #[serde(default)]
    bigram: bool,
}

fn default_rope_theta() -> f64 {
    GptConfig::default().rope_theta
}

fn nanogpt_eps() -> f64 {
    GptConfig::default().layer_norm_eps
}

/// `FILE.safetensors` → `FILE.json`.
pub fn sidecar_path(weights: &Path) -> PathBuf {
    weights.with_extension("json")
}

/// Writes the run's `which` weights to `out` (nanoGPT names, `[out, in]` linears, `lm_head.weight`
/// included even when tied, as nanoGPT's `state_dict` has it) and the sidecar beside it.
pub fn export(run: &Run, which: Which, out: &Path) -> Result<()> {
    let config = run.config.gpt(run.tokenizer.vocab_size());
    let (model, _) = run.load_model(which, &Device::flex())?;
    let tensors = burn_tensors(&model)?;
    let mut exported: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in present(&run.config, run.tokenizer.vocab_size()) {
        let (shape, bytes) = tensors
            .get(&name.burn)
            .ok_or_else(|| anyhow!("the model has no tensor `{}`", name.burn))?;
        let (shape, bytes) = if name.transposed {
            transpose(shape, bytes)
        } else {
            (shape.clone(), bytes.clone())
        };
        exported.push((name.nanogpt, shape, bytes));
    }
    if config.tie_embeddings {
        let (_, shape, bytes) = exported[0].clone();
        exported.push(("lm_head.weight".into(), shape, bytes));
    }
    let bytes = write_safetensors(&exported)?;
    crate::fs::write_atomic(out, &bytes)?;
    let sidecar = Sidecar {
        config: NanoGptConfig {
            block_size: config.block_size,
            vocab_size: config.vocab_size,
            n_layer: config.n_layer,
            n_head: config.n_head,
            n_embd: config.n_embd,
            dropout: config.dropout,
            bias: config.bias,
            layer_norm_eps: config.layer_norm_eps,
            position: config.position,
            norm: config.norm,
            mlp: Some(config.mlp),
            activation: None,
            logit_softcap: config.logit_softcap,
            rope_theta: config.rope_theta,
            n_kv_head: config.n_kv_head,
            qk_norm: config.qk_norm,
            mlp_hidden: config.mlp_hidden,
            proj_init: config.proj_init,
            bigram: config.bigram,
        },
        tokenizer: tokenizer_json(&run.tokenizer)?,
        chat: run.config.chat.clone(),
    };
    crate::fs::write_atomic(
        &sidecar_path(out),
        serde_json::to_string_pretty(&sidecar)?.as_bytes(),
    )
}

/// Builds a run directory in `out` from a nanoGPT-named safetensors file and its sidecar.
pub fn import(from: &Path, out: &Path) -> Result<Imported> {
    let (sidecar, tokenizer) = read_sidecar(from)?;
    let file = ForeignTensors::from_safetensors(from)?;
    let c = &sidecar.config;
    let model = GptConfig {
        block_size: c.block_size,
        n_layer: c.n_layer,
        n_head: c.n_head,
        n_embd: c.n_embd,
        dropout: c.dropout,
        bias: c.bias,
        tie_embeddings: file.tied(),
        layer_norm_eps: c.layer_norm_eps,
        position: c.position,
        norm: c.norm,
        logit_softcap: c.logit_softcap,
        mlp: match (c.mlp, c.activation) {
            (Some(mlp), _) => mlp,
            (None, Some(activation)) => activation,
            (None, None) => Mlp::Gelu,
        },
        rope_theta: c.rope_theta,
        n_kv_head: c.n_kv_head,
        qk_norm: c.qk_norm,
        mlp_hidden: c.mlp_hidden,
        proj_init: c.proj_init,
        bigram: c.bigram,
        // Filled in from the tokenizer by `imported_config`.
        vocab_size: 0,
    };
    let (mut config, note) = imported_config(model, &tokenizer, c.vocab_size, &sidecar_path(from))?;
    config.chat = sidecar.chat.clone();
    config
        .chat
        .validate()
        .with_context(|| sidecar_path(from).display().to_string())?;
    let vocab_size = c.vocab_size;
    let model = file.model(&config, vocab_size, Layout::Linear)?;
    create_run(out, config.clone(), tokenizer, &model)?;
    Ok(Imported {
        format: "tinygpt export (safetensors + sidecar)",
        config,
        vocab_size,
        notes: note.into_iter().collect(),
    })
}

/// The sidecar beside `weights` and the tokenizer it holds.
fn read_sidecar(weights: &Path) -> Result<(Sidecar, Tokenizer)> {
    let path = sidecar_path(weights);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the sidecar {}", path.display()))?;
    let sidecar: Sidecar = serde_json::from_str(&text)
        .with_context(|| format!("sidecar {} is invalid", path.display()))?;
    let tokenizer = tokenizer_from_json(sidecar.tokenizer.clone())
        .with_context(|| format!("sidecar {}", path.display()))?;
    Ok((sidecar, tokenizer))
}

/// nanoGPT's `meta.pkl` maps for a char tokenizer (its special tokens after the characters,
/// each one entry that nanoGPT's `decode` writes as its text and `encode` never gives); Hugging
/// Face JSON for BPE.
fn tokenizer_json(tokenizer: &Tokenizer) -> Result<serde_json::Value> {
    let Some(chars) = tokenizer.chars() else {
        return Ok(serde_json::from_str(&tokenizer.to_json()?)?);
    };
    let texts: Vec<String> = (chars.iter().map(char::to_string))
        .chain(tokenizer.specials().iter().map(|s| s.text.clone()))
        .collect();
    Ok(serde_json::json!({
        "kind": "char",
        "vocab_size": texts.len(),
        "stoi": texts.iter().enumerate().map(|(i, t)| (t.clone(), i)).collect::<BTreeMap<_, _>>(),
        "itos": texts.iter().enumerate().map(|(i, t)| (i.to_string(), t.clone())).collect::<BTreeMap<_, _>>(),
    }))
}

fn tokenizer_from_json(value: serde_json::Value) -> Result<Tokenizer> {
    if value.get("kind").and_then(|k| k.as_str()) == Some("char") {
        let itos: BTreeMap<String, String> = serde_json::from_value(
            value
                .get("itos")
                .cloned()
                .ok_or_else(|| anyhow!("the char tokenizer has no `itos`"))?,
        )
        .context("tokenizer `itos` must map ids to characters")?;
        return char_tokenizer(&itos);
    }
    Tokenizer::from_json(&value.to_string())
}

/// A char tokenizer from nanoGPT's `itos` map (id, as text, to a one-character string).
pub(super) fn char_tokenizer(itos: &BTreeMap<String, String>) -> Result<Tokenizer> {
    let mut chars = Vec::with_capacity(itos.len());
    let mut specials = Vec::new();
    for i in 0..itos.len() {
        let s = itos
            .get(&i.to_string())
            .ok_or_else(|| anyhow!("tokenizer `itos` has no id {i}"))?;
        let mut it = s.chars();
        match (it.next(), it.next()) {
            (Some(c), None) if specials.is_empty() => chars.push(c),
            // tinygpt's special tokens, after the characters.
            (Some('<'), Some('|')) if s.ends_with("|>") => specials.push(s.clone()),
            _ => bail!("tokenizer `itos[{i}]` = {s:?} is not one character"),
        }
    }
    let file = serde_json::json!({"kind": "char", "itos": chars, "specials": specials});
    Tokenizer::from_json(&file.to_string())
}
