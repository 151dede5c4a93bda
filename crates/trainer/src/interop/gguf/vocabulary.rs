//! Which vocabulary a tokenizer or a GGUF file is, and the module that writes or reads it:
//! SentencePiece ([`spm`]) as llama.cpp's `llama` vocabulary, anything else as its byte-level
//! BPE ([`bpe`]).

use anyhow::{Result, bail};

use super::file::{Gguf, Value};
use super::{bpe, spm};
use crate::data::tokenizer::Tokenizer;

/// A run's tokenizer as `tokenizer.*` entries of `rows` tokens with the chat template
/// `template`: a SentencePiece tokenizer (an imported Llama 2's, TinyLlama's) as llama.cpp's
/// `llama` vocabulary, any other as its byte-level BPE.
pub(super) fn entries(
    tokenizer: &Tokenizer,
    rows: usize,
    template: Option<&str>,
) -> Result<Vec<(String, Value)>> {
    // A char vocabulary as is; any other from its Hugging Face form, read once.
    let mut entries = match tokenizer.chars() {
        Some(_) => bpe::metadata(tokenizer, rows)?,
        None => {
            let hf: serde_json::Value = serde_json::from_str(&tokenizer.to_hf_json()?)?;
            match spm::space_prefix(&hf)? {
                Some(prefix) => spm::metadata(&hf, prefix, rows)?,
                None => bpe::metadata_from_hf(tokenizer, &hf, rows)?,
            }
        }
    };
    entries.extend(bpe::starts_and_ends(tokenizer, template));
    Ok(entries)
}

/// The tokenizer of a GGUF file's `tokenizer.*` metadata: byte-level BPE (`gpt2`) or
/// SentencePiece (`llama`). Anything else is an error naming it, and the way around it.
pub(super) fn read(gguf: &Gguf) -> Result<Tokenizer> {
    let around = bpe::AROUND;
    match gguf.get("tokenizer.ggml.model").and_then(Value::as_str) {
        Some("gpt2") => bpe::tokenizer(gguf),
        Some("llama") => spm::tokenizer(gguf),
        Some(other) => bail!(
            "tokenizer.ggml.model \"{other}\" is neither byte-level BPE (gpt2) nor SentencePiece \
             (llama): {around}"
        ),
        None => bail!("it has no tokenizer (tokenizer.ggml.model): {around}"),
    }
}
