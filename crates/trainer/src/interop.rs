//! `tinygpt export` / `tinygpt import`: weights under nanoGPT's names and PyTorch's layout.
//!
//! nanoGPT's `state_dict` names every tensor `transformer.…` (or `lm_head.weight`) and stores a
//! `Linear` weight as `[out, in]`; Burn's `Linear` keeps `[in, out]` and its LayerNorm calls the
//! scale and shift `gamma` and `beta`. One table ([`names`]) pairs the two namings; export walks
//! it one way, import the other, and both check every shape and dtype against the model that the
//! config describes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};
use tinygpt_model::Gpt;

use crate::checkpoint::{self, Run, TrainState, Which};
use crate::config::{ModelSection, RunConfig, TokenizerKind};
use crate::tokenizer::Tokenizer;

/// One tensor under both names. `transpose`: a `Linear` weight (`[in, out]` in Burn).
struct Name {
    burn: String,
    nanogpt: String,
    transpose: bool,
}

/// Every parameter of a model with `config`'s shape, in nanoGPT's order.
fn names(config: &ModelSection) -> Vec<Name> {
    let mut names = Vec::new();
    let mut add = |burn: String, nanogpt: String, transpose: bool| {
        names.push(Name {
            burn,
            nanogpt,
            transpose,
        })
    };
    add("wte.weight".into(), "transformer.wte.weight".into(), false);
    add("wpe.weight".into(), "transformer.wpe.weight".into(), false);
    let norm = |add: &mut dyn FnMut(String, String, bool), burn: &str, torch: &str| {
        add(format!("{burn}.gamma"), format!("{torch}.weight"), false);
        if config.bias {
            add(format!("{burn}.beta"), format!("{torch}.bias"), false);
        }
    };
    let linear = |add: &mut dyn FnMut(String, String, bool), burn: &str, torch: &str| {
        add(format!("{burn}.weight"), format!("{torch}.weight"), true);
        if config.bias {
            add(format!("{burn}.bias"), format!("{torch}.bias"), false);
        }
    };
    for i in 0..config.n_layer {
        let (b, t) = (format!("h.{i}"), format!("transformer.h.{i}"));
        norm(&mut add, &format!("{b}.ln_1"), &format!("{t}.ln_1"));
        linear(
            &mut add,
            &format!("{b}.attn.c_attn"),
            &format!("{t}.attn.c_attn"),
        );
        linear(
            &mut add,
            &format!("{b}.attn.c_proj"),
            &format!("{t}.attn.c_proj"),
        );
        norm(&mut add, &format!("{b}.ln_2"), &format!("{t}.ln_2"));
        linear(&mut add, &format!("{b}.mlp.c_fc"), &format!("{t}.mlp.c_fc"));
        linear(
            &mut add,
            &format!("{b}.mlp.c_proj"),
            &format!("{t}.mlp.c_proj"),
        );
    }
    norm(&mut add, "ln_f", "transformer.ln_f");
    if !config.tie_embeddings {
        add("lm_head.weight".into(), "lm_head.weight".into(), true);
    }
    names
}

/// The sidecar JSON: nanoGPT's `GPTConfig` fields and its `meta.pkl` maps.
#[derive(Serialize, Deserialize)]
struct Sidecar {
    config: NanoGptConfig,
    /// `char`: nanoGPT's `stoi` / `itos`; `bpe`: Hugging Face tokenizer JSON.
    tokenizer: serde_json::Value,
}

#[derive(Serialize, Deserialize)]
struct NanoGptConfig {
    block_size: usize,
    vocab_size: usize,
    n_layer: usize,
    n_head: usize,
    n_embd: usize,
    dropout: f64,
    bias: bool,
}

/// `FILE.safetensors` → `FILE.json`.
pub fn sidecar_path(weights: &Path) -> PathBuf {
    weights.with_extension("json")
}

/// Writes the run's `which` weights to `out` (nanoGPT names, `[out, in]` linears, `lm_head.weight`
/// included even when tied, as nanoGPT's `state_dict` has it) and the sidecar beside it.
pub fn export(run: &Run, which: Which, out: &Path) -> Result<()> {
    let config = &run.config.model;
    let (model, _) = run.load_model(which, &Device::flex())?;
    let tensors = burn_tensors(&model)?;
    let mut exported: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in names(config) {
        let (shape, bytes) = tensors
            .get(&name.burn)
            .ok_or_else(|| anyhow!("the model has no tensor `{}`", name.burn))?;
        let (shape, bytes) = if name.transpose {
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
    checkpoint::write_atomic(out, &bytes)?;
    let sidecar = Sidecar {
        config: NanoGptConfig {
            block_size: config.block_size,
            vocab_size: run.tokenizer.vocab_size(),
            n_layer: config.n_layer,
            n_head: config.n_head,
            n_embd: config.n_embd,
            dropout: config.dropout,
            bias: config.bias,
        },
        tokenizer: tokenizer_json(&run.tokenizer)?,
    };
    checkpoint::write_atomic(
        &sidecar_path(out),
        serde_json::to_string_pretty(&sidecar)?.as_bytes(),
    )
}

/// Builds a run directory in `out` from a nanoGPT-named safetensors file and its sidecar.
pub fn import(from: &Path, out: &Path) -> Result<()> {
    let sidecar_file = sidecar_path(from);
    let sidecar: Sidecar = serde_json::from_str(
        &std::fs::read_to_string(&sidecar_file)
            .with_context(|| format!("cannot read the sidecar {}", sidecar_file.display()))?,
    )
    .with_context(|| format!("sidecar {} is invalid", sidecar_file.display()))?;
    let tokenizer = tokenizer_from_json(sidecar.tokenizer)
        .with_context(|| format!("sidecar {}", sidecar_file.display()))?;
    let c = &sidecar.config;
    if tokenizer.vocab_size() != c.vocab_size {
        bail!(
            "sidecar {}: vocab_size {} but the tokenizer has {} tokens",
            sidecar_file.display(),
            c.vocab_size,
            tokenizer.vocab_size()
        );
    }
    let bytes = std::fs::read(from).with_context(|| format!("cannot read {}", from.display()))?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("{} is not a valid safetensors file ({e})", from.display()))?;

    // Tied unless the file's head differs from its embedding.
    let tie_embeddings = match (
        file.tensor("lm_head.weight"),
        file.tensor("transformer.wte.weight"),
    ) {
        (Ok(head), Ok(wte)) => head.data() == wte.data(),
        _ => true,
    };
    let mut config = RunConfig {
        model: ModelSection {
            block_size: c.block_size,
            n_layer: c.n_layer,
            n_head: c.n_head,
            n_embd: c.n_embd,
            dropout: c.dropout,
            bias: c.bias,
            tie_embeddings,
            ..ModelSection::default()
        },
        ..RunConfig::default()
    };
    config.data.tokenizer = match tokenizer {
        Tokenizer::Char { .. } => TokenizerKind::Char,
        Tokenizer::Bpe(_) => TokenizerKind::Bpe,
    };
    config.validate().context("the sidecar's config")?;

    // Expected Burn shapes come from a model of this architecture.
    let mut model = config.gpt(c.vocab_size).init(&Device::flex())?;
    let expected = burn_tensors(&model)?;
    let mut tensors = Vec::new();
    let mut used = vec!["lm_head.weight".to_string()];
    for name in names(&config.model) {
        let view = file.tensor(&name.nanogpt).map_err(|_| {
            anyhow!(
                "tensor `{}` is missing from {}",
                name.nanogpt,
                from.display()
            )
        })?;
        if view.dtype() != Dtype::F32 {
            bail!(
                "tensor `{}` is {:?}; only F32 is supported",
                name.nanogpt,
                view.dtype()
            );
        }
        let (burn_shape, _) = &expected[&name.burn];
        let want: Vec<usize> = if name.transpose {
            vec![burn_shape[1], burn_shape[0]]
        } else {
            burn_shape.clone()
        };
        if view.shape() != want.as_slice() {
            bail!(
                "tensor `{}` has shape {:?}, expected {:?}",
                name.nanogpt,
                view.shape(),
                want
            );
        }
        let (shape, data) = if name.transpose {
            transpose(&want, view.data())
        } else {
            (want, view.data().to_vec())
        };
        tensors.push((name.burn, shape, data));
        used.push(name.nanogpt);
    }
    if let Some(extra) = file
        .names()
        .into_iter()
        .find(|n| !used.iter().any(|u| u == n))
    {
        bail!(
            "unexpected tensor `{extra}` in {} (another architecture?)",
            from.display()
        );
    }
    checkpoint::load_weights(&mut model, write_safetensors(&tensors)?)?;

    let run = Run::create(out, config, tokenizer)?;
    let state = TrainState::default();
    run.save(Which::Best, &model, None, &state)?;
    run.save(Which::Last, &model, None, &state)
}

/// The model's tensors by Burn path: shape and little-endian f32 bytes.
/// Shape and little-endian f32 bytes of each tensor, by name.
type TensorTable = HashMap<String, (Vec<usize>, Vec<u8>)>;

fn burn_tensors(model: &Gpt) -> Result<TensorTable> {
    model
        .collect(None, None, false)
        .into_iter()
        .map(|t| {
            if t.dtype != DType::F32 {
                bail!("tensor `{}` is {:?}, not F32", t.name, t.dtype);
            }
            let name = t.name.clone();
            let shape = t.shape.to_vec();
            let bytes = t
                .to_bytes()
                .map_err(|e| anyhow!("tensor `{name}`: {e:?}"))?;
            Ok((name, (shape, bytes.to_vec())))
        })
        .collect()
}

/// `[rows, cols]` f32 bytes → `[cols, rows]`.
fn transpose(shape: &[usize], bytes: &[u8]) -> (Vec<usize>, Vec<u8>) {
    let (rows, cols) = (shape[0], shape[1]);
    let mut out = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * 4, (c * rows + r) * 4);
            out[to..to + 4].copy_from_slice(&bytes[from..from + 4]);
        }
    }
    (vec![cols, rows], out)
}

/// F32 tensors as a safetensors file; deterministic (sorted names, fixed metadata).
fn write_safetensors(tensors: &[(String, Vec<usize>, Vec<u8>)]) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            Ok((
                name.clone(),
                TensorView::new(Dtype::F32, shape.clone(), bytes)?,
            ))
        })
        .collect::<Result<BTreeMap<_, _>, safetensors::SafeTensorError>>()
        .map_err(|e| anyhow!("cannot build the safetensors file: {e}"))?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata))
        .map_err(|e| anyhow!("cannot write safetensors: {e}"))
}

/// nanoGPT's `meta.pkl` maps for a char tokenizer; Hugging Face JSON for BPE.
fn tokenizer_json(tokenizer: &Tokenizer) -> Result<serde_json::Value> {
    Ok(match tokenizer.chars() {
        Some(chars) => serde_json::json!({
            "kind": "char",
            "vocab_size": chars.len(),
            "stoi": chars.iter().enumerate().map(|(i, c)| (c.to_string(), i)).collect::<BTreeMap<_, _>>(),
            "itos": chars.iter().enumerate().map(|(i, c)| (i.to_string(), c.to_string())).collect::<BTreeMap<_, _>>(),
        }),
        None => serde_json::from_str(&tokenizer.to_json()?)?,
    })
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
        let mut chars = Vec::with_capacity(itos.len());
        for i in 0..itos.len() {
            let s = itos
                .get(&i.to_string())
                .ok_or_else(|| anyhow!("tokenizer `itos` has no id {i}"))?;
            let mut it = s.chars();
            match (it.next(), it.next()) {
                (Some(c), None) => chars.push(c),
                _ => bail!("tokenizer `itos[{i}]` = {s:?} is not one character"),
            }
        }
        return Tokenizer::from_json(
            &serde_json::json!({"kind": "char", "itos": chars}).to_string(),
        );
    }
    Tokenizer::from_json(&value.to_string())
}
