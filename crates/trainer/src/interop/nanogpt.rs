//! nanoGPT's own files, read without Python: `out/ckpt.pt` (what `train.py` saves: `model`,
//! `optimizer`, `model_args`, `iter_num`, `best_val_loss`, `config`) and
//! `data/<dataset>/meta.pkl` (what the char `prepare.py` saves: `vocab_size`, `itos`, `stoi`).
//!
//! The architecture is `model_args`; nanoGPT's model is exact GELU, LayerNorm epsilon 1e-5 and
//! a tied LM head, so those are tinygpt's defaults already. A vocabulary larger than the
//! tokenizer's (GPT-2's 50257 padded to 50304) becomes `model.vocab_size`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use pytorch_reader::{PickleValue, PytorchReader};

use super::foreign::{ForeignTensors, Layout};
use super::run::{ImportOptions, Imported, create_run, imported_config};
use super::sidecar::char_tokenizer;
use crate::data::tokenizer::Tokenizer;
use tinygpt_model::GptConfig;

/// GPT-2's BPE vocabulary, and nanoGPT's padding of it to a multiple of 64.
const GPT2_VOCABS: [usize; 2] = [50257, 50304];

/// Imports nanoGPT's `ckpt.pt` at `from` into the run directory `out`.
pub fn import(from: &Path, options: &ImportOptions, out: &Path) -> Result<Imported> {
    let root = PytorchReader::read_pickle_data(from, None)
        .map_err(|e| anyhow!("{} is not a PyTorch checkpoint ({e})", from.display()))?;
    let PickleValue::Dict(root) = root else {
        bail!(
            "{} is not a nanoGPT checkpoint (not a dict)",
            from.display()
        );
    };
    let Some(PickleValue::Dict(args)) = root.get("model_args") else {
        bail!(
            "{} is not a nanoGPT checkpoint: it has no `model_args` (for a Hugging Face model, \
             pass its directory)",
            from.display()
        );
    };
    let args = ModelArgs::read(args).with_context(|| format!("{}: model_args", from.display()))?;
    let tokenizer = tokenizer(from, &root, &args, options)?;
    let tensors = ForeignTensors::from_pytorch(from, Some("model"))?;
    let model = GptConfig {
        block_size: args.block_size,
        n_layer: args.n_layer,
        n_head: args.n_head,
        n_embd: args.n_embd,
        dropout: args.dropout,
        bias: args.bias,
        tie_embeddings: tensors.tied(),
        ..GptConfig::default()
    };
    let (config, note) = imported_config(model, &tokenizer, args.vocab_size, from)?;
    let mut notes: Vec<String> = note.into_iter().collect();
    if let Some(PickleValue::Int(iter)) = root.get("iter_num") {
        notes.push(format!("nanoGPT had trained it for {iter} iterations"));
    }
    let model = tensors.model(&config, args.vocab_size, Layout::Linear)?;
    create_run(out, config.clone(), tokenizer, &model)?;
    Ok(Imported {
        format: "nanoGPT checkpoint",
        config,
        vocab_size: args.vocab_size,
        notes,
    })
}

/// nanoGPT's `GPTConfig` as `train.py` saves it.
struct ModelArgs {
    n_layer: usize,
    n_head: usize,
    n_embd: usize,
    block_size: usize,
    bias: bool,
    vocab_size: usize,
    dropout: f64,
}

impl ModelArgs {
    fn read(args: &HashMap<String, PickleValue>) -> Result<Self> {
        let int = |key: &str| match args.get(key) {
            Some(PickleValue::Int(n)) if *n > 0 => Ok(*n as usize),
            Some(other) => bail!("`{key}` must be a positive int, got {other:?}"),
            None => bail!("`{key}` is missing"),
        };
        Ok(Self {
            n_layer: int("n_layer")?,
            n_head: int("n_head")?,
            n_embd: int("n_embd")?,
            block_size: int("block_size")?,
            vocab_size: int("vocab_size")?,
            bias: match args.get("bias") {
                Some(PickleValue::Bool(b)) => *b,
                other => bail!("`bias` must be a bool, got {other:?}"),
            },
            dropout: match args.get("dropout") {
                Some(PickleValue::Float(d)) => *d,
                Some(PickleValue::Int(d)) => *d as f64,
                other => bail!("`dropout` must be a number, got {other:?}"),
            },
        })
    }
}

/// The tokenizer of the checkpoint: `--meta` (char) or `--tokenizer` (BPE); without either,
/// an error saying which one this checkpoint needs.
fn tokenizer(
    from: &Path,
    root: &HashMap<String, PickleValue>,
    args: &ModelArgs,
    options: &ImportOptions,
) -> Result<Tokenizer> {
    let tokenizer = match (&options.meta, &options.tokenizer) {
        (Some(_), Some(_)) => bail!("give --meta or --tokenizer, not both"),
        (Some(meta), None) => read_meta(meta)?,
        (None, Some(path)) => Tokenizer::from_hf_file(path)?,
        (None, None) if GPT2_VOCABS.contains(&args.vocab_size) => bail!(
            "{} has GPT-2's BPE vocabulary ({} tokens) and holds no tokenizer: pass --tokenizer \
             with GPT-2's tokenizer.json (from a Hugging Face gpt2 directory)",
            from.display(),
            args.vocab_size
        ),
        (None, None) => {
            let dataset = match root.get("config") {
                Some(PickleValue::Dict(c)) => match c.get("dataset") {
                    Some(PickleValue::String(d)) => d.clone(),
                    _ => "<dataset>".into(),
                },
                _ => "<dataset>".into(),
            };
            bail!(
                "{} holds no tokenizer: pass --meta data/{dataset}/meta.pkl (written by \
                 nanoGPT's prepare.py)",
                from.display()
            )
        }
    };
    Ok(tokenizer)
}

/// A char tokenizer from nanoGPT's `meta.pkl`.
fn read_meta(path: &Path) -> Result<Tokenizer> {
    let value = PytorchReader::read_pickle_data(path, None)
        .map_err(|e| anyhow!("{} is not a pickle ({e})", path.display()))?;
    let itos = match &value {
        PickleValue::Dict(meta) => meta.get("itos"),
        _ => None,
    };
    let Some(PickleValue::Dict(itos)) = itos else {
        bail!(
            "{} is not nanoGPT's meta.pkl: it has no `itos` map",
            path.display()
        );
    };
    let itos: BTreeMap<String, String> = itos
        .iter()
        .map(|(id, s)| match s {
            PickleValue::String(s) => Ok((id.clone(), s.clone())),
            other => bail!("`itos[{id}]` is {other:?}, not a string"),
        })
        .collect::<Result<_>>()
        .with_context(|| path.display().to_string())?;
    char_tokenizer(&itos).with_context(|| path.display().to_string())
}
