//! Tokenizers as Hugging Face `tokenizer.json`, in and out. A char vocabulary is written as a
//! BPE model without merges or pre-tokenizer (each character one token, its id tinygpt's) and
//! a `Fuse` decoder, its special tokens as `added_tokens`; such a file reads back as a char
//! tokenizer, so unknown characters stay errors.

use anyhow::{Context, Result, anyhow};
use serde_json::{Value, json};

use super::Tokenizer;

impl Tokenizer {
    /// A Hugging Face `tokenizer.json` file. One that spells a char vocabulary (as
    /// [`to_hf_json`](Self::to_hf_json) writes it) becomes a char tokenizer again.
    pub(crate) fn from_hf_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // JSON first: `tokenizers` panics on a syntax error inside `decoder` when it parses
        // the text itself.
        let json = serde_json::from_str(&text).map_err(|e| {
            anyhow!(
                "{} is not a Hugging Face tokenizer.json ({e})",
                path.display()
            )
        })?;
        Self::from_hf_value(json).map_err(|e| {
            anyhow!(
                "{} is not a Hugging Face tokenizer.json ({e})",
                path.display()
            )
        })
    }

    /// A Hugging Face `tokenizer.json`, already parsed as JSON.
    pub(crate) fn from_hf_value(json: Value) -> Result<Self> {
        let tokenizer =
            serde_json::from_value::<tokenizers::Tokenizer>(json).map_err(|e| anyhow!("{e}"))?;
        Ok(match char_vocabulary(&tokenizer) {
            Some((itos, specials)) => Self::from_chars(itos, specials),
            None => Self::bpe(tokenizer),
        })
    }

    /// This tokenizer as a Hugging Face `tokenizer.json`.
    pub(crate) fn to_hf_json(&self) -> Result<String> {
        let value = match self {
            Self::Bpe(t) => serde_json::to_value(&t.hf)?,
            Self::Char { itos, specials, .. } => {
                let mut vocab: serde_json::Map<String, Value> = itos
                    .iter()
                    .enumerate()
                    .map(|(id, c)| (c.to_string(), id.into()))
                    .collect();
                let mut added = Vec::new();
                for s in specials {
                    vocab.insert(s.text.clone(), s.id.into());
                    added.push(json!({
                        "id": s.id, "content": s.text, "single_word": false, "lstrip": false,
                        "rstrip": false, "normalized": false, "special": true,
                    }));
                }
                json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": added,
                    "normalizer": null,
                    "pre_tokenizer": null,
                    "post_processor": null,
                    "decoder": {"type": "Fuse"},
                    "model": {
                        "type": "BPE",
                        "dropout": null,
                        "unk_token": null,
                        "continuing_subword_prefix": null,
                        "end_of_word_suffix": null,
                        "fuse_unk": false,
                        "byte_fallback": false,
                        "ignore_merges": false,
                        "vocab": vocab,
                        "merges": [],
                    },
                })
            }
        };
        Ok(serde_json::to_string_pretty(&value)?)
    }
}

/// The characters by id, and the special token texts after them, of a tokenizer that is a char
/// vocabulary: BPE without merges, normalizer or pre-tokenizer, a `Fuse` decoder, one character
/// per token, and any added tokens special ones at the end.
fn char_vocabulary(tokenizer: &tokenizers::Tokenizer) -> Option<(Vec<char>, Vec<String>)> {
    let value = serde_json::to_value(tokenizer).ok()?;
    let model = value.get("model")?;
    let plain = model.get("type")? == "BPE"
        && model.get("merges")?.as_array()?.is_empty()
        && value.get("normalizer")?.is_null()
        && value.get("pre_tokenizer")?.is_null()
        && value.get("decoder")?.get("type")? == "Fuse";
    if !plain {
        return None;
    }
    let mut specials: Vec<(u64, String)> = Vec::new();
    for added in value.get("added_tokens")?.as_array()? {
        if added.get("special")?.as_bool() != Some(true) {
            return None;
        }
        let text = added.get("content")?.as_str()?.to_owned();
        specials.push((added.get("id")?.as_u64()?, text));
    }
    specials.sort();
    let vocab = model.get("vocab")?.as_object()?;
    let chars = vocab.len().checked_sub(specials.len())?;
    let at_end = specials
        .iter()
        .enumerate()
        .all(|(i, (id, _))| *id == (chars + i) as u64);
    if !at_end {
        return None;
    }
    let mut itos = vec![None; chars];
    for (token, id) in vocab {
        if specials.iter().any(|(_, s)| s == token) {
            continue;
        }
        let mut it = token.chars();
        let (Some(c), None) = (it.next(), it.next()) else {
            return None;
        };
        *itos.get_mut(usize::try_from(id.as_u64()?).ok()?)? = Some(c);
    }
    let itos = itos.into_iter().collect::<Option<Vec<char>>>()?;
    Some((itos, specials.into_iter().map(|(_, s)| s).collect()))
}
