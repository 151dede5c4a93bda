//! `tinygpt export` / `tinygpt import`: weights under nanoGPT's names and PyTorch's layout.
//!
//! nanoGPT's `state_dict` names every tensor `transformer.…` (or `lm_head.weight`) and stores a
//! `Linear` weight as `[out, in]`; Burn's `Linear` keeps `[in, out]` and its LayerNorm calls the
//! scale and shift `gamma` and `beta`. The model crate's [`parameter_table`] pairs the two namings; export walks
//! it one way, import the other, and both check every shape and dtype against the model that the
//! config describes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use burn::store::ModuleSnapshot;
use burn::tensor::{DType, Device};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};
use tinygpt_model::{Gpt, ParamName, parameter_table};

use crate::checkpoint::{self, Run, TrainState, Which};
use crate::config::{ModelSection, RunConfig, TokenizerKind};
use crate::tokenizer::Tokenizer;

/// The present parameters of a model of `config`'s shape, in nanoGPT's order (the model
/// crate's one table of names).
fn names(config: &RunConfig, vocab_size: usize) -> Vec<ParamName> {
    parameter_table(&config.gpt(vocab_size))
        .into_iter()
        .filter(|p| p.present)
        .collect()
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
    for name in names(&run.config, run.tokenizer.vocab_size()) {
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
    let (sidecar, tokenizer) = read_sidecar(from)?;
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
    let config = imported_config(&sidecar.config, &tokenizer, tie_embeddings)?;
    let model = imported_model(&file, &config, sidecar.config.vocab_size)
        .map_err(|e| anyhow!("{}: {e:#}", from.display()))?;
    let state = TrainState::default();
    Run::create(out, config, tokenizer, |run| {
        run.save(Which::Best, &model, None, &state)?;
        run.save(Which::Last, &model, None, &state)
    })?;
    Ok(())
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
    if tokenizer.vocab_size() != sidecar.config.vocab_size {
        bail!(
            "sidecar {}: vocab_size {} but the tokenizer has {} tokens",
            path.display(),
            sidecar.config.vocab_size,
            tokenizer.vocab_size()
        );
    }
    Ok((sidecar, tokenizer))
}

/// The run config of an imported model: nanoGPT's architecture, tinygpt's other defaults.
fn imported_config(
    c: &NanoGptConfig,
    tokenizer: &Tokenizer,
    tie_embeddings: bool,
) -> Result<RunConfig> {
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
    Ok(config)
}

/// A model of `config` holding the tensors of `file`: every parameter present, F32, of the
/// right shape, and nothing else.
fn imported_model(file: &SafeTensors<'_>, config: &RunConfig, vocab_size: usize) -> Result<Gpt> {
    // Expected Burn shapes come from a model of this architecture.
    let mut model = config.gpt(vocab_size).init(&Device::flex())?;
    let expected = burn_tensors(&model)?;
    let mut tensors = Vec::new();
    let mut used = vec!["lm_head.weight".to_string()];
    for name in names(config, vocab_size) {
        let view = file
            .tensor(&name.nanogpt)
            .map_err(|_| anyhow!("tensor `{}` is missing", name.nanogpt))?;
        if view.dtype() != Dtype::F32 {
            bail!(
                "tensor `{}` is {:?}; only F32 is supported",
                name.nanogpt,
                view.dtype()
            );
        }
        let (burn_shape, _) = &expected[&name.burn];
        let want: Vec<usize> = if name.transposed {
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
        let (shape, data) = if name.transposed {
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
        bail!("unexpected tensor `{extra}` (another architecture?)");
    }
    checkpoint::load_weights(&mut model, write_safetensors(&tensors)?)?;
    Ok(model)
}

/// Shape and little-endian f32 bytes of each tensor, by Burn path.
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
