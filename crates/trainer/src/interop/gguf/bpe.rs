//! A run's tokenizer as GGUF's `tokenizer.*` metadata, in the form llama.cpp's byte-level BPE
//! (`tokenizer.ggml.model = "gpt2"`) tokenizes exactly as tinygpt does.
//!
//! Byte-level BPE spells every token in GPT-2's byte alphabet (each byte one printable
//! character: a space is `Ġ`, a newline `Ċ`) and builds tokens from bytes by its merges, so a
//! byte-level vocabulary goes over as it is. A char vocabulary becomes one too: each character
//! is the token of its UTF-8 bytes, and a character of several bytes gets the merges that join
//! them left to right (`Ã` + `©` → `Ã©`, which is `é`). No merge joins two characters, since
//! every merge's left side is an unfinished character and UTF-8 lets no character start inside
//! another; so llama.cpp cuts text into exactly tinygpt's characters. Special tokens are
//! control tokens, matched in text only where the caller asks for special tokens, as in tinygpt.
//!
//! Read back ([`tokenizer`]), byte-level BPE metadata becomes a Hugging Face tokenizer with the
//! pre-tokenizer llama.cpp applies for the file's `tokenizer.ggml.pre`.

use std::collections::BTreeSet;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value as Json, json};

use super::file::{Gguf, Value};
use crate::data::tokenizer::Tokenizer;

/// llama.cpp's token types (`llama_token_type`).
pub(super) const NORMAL: i32 = 1;
pub(super) const CONTROL: i32 = 3;
pub(super) const UNUSED: i32 = 5;
pub(super) const USER_DEFINED: i32 = 4;

/// GPT-2's byte alphabet: the printable character that stands for each byte.
pub(crate) fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let code = match printable {
            true => b as u32,
            false => {
                extra += 1;
                255 + extra
            }
        };
        *slot = char::from_u32(code).expect("below the surrogates");
    }
    table
}

/// `text`'s bytes in the byte alphabet.
fn byte_level(text: &str, alphabet: &[char; 256]) -> String {
    text.bytes().map(|b| alphabet[b as usize]).collect()
}

/// The `tokenizer.*` entries of a char or byte-level BPE tokenizer as llama.cpp's byte-level
/// BPE, with `rows` tokens (the model's embedding rows, at least the tokenizer's; rows past it
/// are unused tokens) and the pre-tokenizer that splits text as the tokenizer's own.
pub fn metadata(tokenizer: &Tokenizer, rows: usize) -> Result<Vec<(String, Value)>> {
    match tokenizer.chars() {
        Some(chars) => {
            let (tokens, merges) = char_tokens(chars);
            byte_level_vocabulary(tokenizer, tokens, merges, "gpt-2", rows)
        }
        None => {
            let hf: Json = serde_json::from_str(&tokenizer.to_hf_json()?)?;
            metadata_from_hf(tokenizer, &hf, rows)
        }
    }
}

/// [`metadata`] of a byte-level BPE tokenizer whose Hugging Face form is `hf`.
pub(super) fn metadata_from_hf(
    tokenizer: &Tokenizer,
    hf: &Json,
    rows: usize,
) -> Result<Vec<(String, Value)>> {
    let (tokens, merges) = bpe_tokens(hf)?;
    byte_level_vocabulary(tokenizer, tokens, merges, super::pre::name_of(hf)?, rows)
}

/// The entries every vocabulary ends with: BOS and EOS, whether a prompt starts with BOS, and
/// the chat template `template`.
pub(super) fn starts_and_ends(
    tokenizer: &Tokenizer,
    template: Option<&str>,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let prompt_start = tokenizer.prompt_start();
    if let Some(bos) = prompt_start.or(tokenizer.start_of_text()) {
        out.push(("tokenizer.ggml.bos_token_id".into(), Value::U32(bos)));
    }
    if let Some(eos) = tokenizer.end_of_text() {
        out.push(("tokenizer.ggml.eos_token_id".into(), Value::U32(eos)));
    }
    // llama.cpp starts a prompt as tinygpt does: with BOS where the tokenizer adds one (an
    // imported Llama-family model's), else with the prompt's own tokens.
    let add_bos = Value::Bool(prompt_start.is_some());
    out.push(("tokenizer.ggml.add_bos_token".into(), add_bos));
    if let Some(template) = template.filter(|t| !t.is_empty()) {
        out.push((
            "tokenizer.chat_template".into(),
            Value::Str(template.into()),
        ));
    }
    out
}

/// The entries of a byte-level BPE vocabulary: `tokens` by id with the tokenizer's special
/// tokens as control tokens, `merges` in rank order, and the pre-tokenizer `pre`.
fn byte_level_vocabulary(
    tokenizer: &Tokenizer,
    mut tokens: Vec<Option<String>>,
    merges: Vec<String>,
    pre: &str,
    rows: usize,
) -> Result<Vec<(String, Value)>> {
    let mut types = vec![NORMAL; tokens.len()];
    for special in tokenizer.specials() {
        put(
            &mut tokens,
            &mut types,
            special.id as usize,
            &special.text,
            CONTROL,
        );
    }
    let (tokens, types) = listed(tokens, types, rows)?;
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::Str("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::Str(pre.into())),
        ("tokenizer.ggml.tokens".into(), tokens),
        ("tokenizer.ggml.token_type".into(), types),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(merges.into_iter().map(Value::Str).collect()),
        ),
    ])
}

/// Sets token `id` to `text` of llama.cpp's type `kind`, growing the lists to hold it.
pub(super) fn put(
    tokens: &mut Vec<Option<String>>,
    types: &mut Vec<i32>,
    id: usize,
    text: &str,
    kind: i32,
) {
    if id >= tokens.len() {
        tokens.resize(id + 1, None);
        types.resize(id + 1, NORMAL);
    }
    tokens[id] = Some(text.into());
    types[id] = kind;
}

/// `tokens` and their `types` as GGUF arrays of `rows` entries: rows no token fills are
/// unused tokens (`[unused7]`).
pub(super) fn listed(
    mut tokens: Vec<Option<String>>,
    mut types: Vec<i32>,
    rows: usize,
) -> Result<(Value, Value)> {
    if tokens.len() > rows {
        bail!(
            "the tokenizer has {} tokens but the model {rows} embedding rows",
            tokens.len()
        );
    }
    tokens.resize(rows, None);
    types.resize(rows, NORMAL);
    let tokens: Vec<Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| {
            Value::Str(t.unwrap_or_else(|| {
                types[id] = UNUSED;
                format!("[unused{id}]")
            }))
        })
        .collect();
    let types = types.into_iter().map(Value::I32).collect();
    Ok((Value::Array(tokens), Value::Array(types)))
}

/// A char vocabulary's tokens by id (each character's bytes in the byte alphabet) and the
/// merges that build its characters of several bytes, shortest prefix first.
fn char_tokens(chars: &[char]) -> (Vec<Option<String>>, Vec<String>) {
    let alphabet = byte_alphabet();
    let mut merges = Vec::new();
    let mut seen = BTreeSet::new();
    let tokens = chars
        .iter()
        .map(|c| {
            let token = byte_level(&c.to_string(), &alphabet);
            let pieces: Vec<char> = token.chars().collect();
            for end in 1..pieces.len() {
                let left: String = pieces[..end].iter().collect();
                let merge = format!("{left} {}", pieces[end]);
                if seen.insert(merge.clone()) {
                    merges.push(merge);
                }
            }
            Some(token)
        })
        .collect();
    (tokens, merges)
}

/// A byte-level BPE tokenizer's tokens by id and merges in rank order, from its Hugging Face
/// form `hf`.
fn bpe_tokens(hf: &Json) -> Result<(Vec<Option<String>>, Vec<String>)> {
    let model = hf
        .get("model")
        .filter(|m| m["type"] == "BPE")
        .ok_or_else(|| anyhow!("the run's tokenizer is not byte-level BPE"))?;
    let tokens = tokens_by_id(model)?;
    let merges = merge_pairs(model)?
        .into_iter()
        .map(|(a, b)| format!("{a} {b}"))
        .collect();
    Ok((tokens, merges))
}

/// The tokens of a Hugging Face BPE `model`'s vocabulary by id (`None` where no token has the
/// id).
pub(super) fn tokens_by_id(model: &Json) -> Result<Vec<Option<String>>> {
    let vocab = model["vocab"]
        .as_object()
        .context("the tokenizer has no vocabulary")?;
    let mut tokens = vec![None; vocab.len()];
    for (text, id) in vocab {
        let id = id.as_u64().context("a token id that is not a number")? as usize;
        if id >= tokens.len() {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some(text.clone());
    }
    Ok(tokens)
}

/// The merges of a Hugging Face BPE `model`, in rank order, each as its two tokens (written
/// `"a b"` or `["a", "b"]`).
pub(super) fn merge_pairs(model: &Json) -> Result<Vec<(String, String)>> {
    let bad = |m: &Json| anyhow!("a merge that is not two tokens: {m}");
    model["merges"]
        .as_array()
        .context("the tokenizer has no merges")?
        .iter()
        .map(|m| match m {
            Json::String(s) => s
                .split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| bad(m)),
            Json::Array(pair) => match (pair.first(), pair.get(1), pair.len()) {
                (Some(Json::String(a)), Some(Json::String(b)), 2) => Ok((a.clone(), b.clone())),
                _ => Err(bad(m)),
            },
            _ => Err(bad(m)),
        })
        .collect()
}

/// A vocabulary of single characters then control tokens (then unused rows), as
/// [`char_tokens`] writes tinygpt's char vocabularies: the Hugging Face `tokenizer.json` that
/// reads back as that char tokenizer. `None` for any other vocabulary.
fn as_chars(tokens: &[String], types: &[i32]) -> Option<Json> {
    let alphabet = byte_alphabet();
    let byte_of = |c: char| alphabet.iter().position(|&a| a == c).map(|b| b as u8);
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    let end = types
        .iter()
        .rposition(|&t| t != UNUSED)
        .map_or(0, |last| last + 1);
    for (id, (token, &kind)) in tokens.iter().zip(types).take(end).enumerate() {
        let text = match kind {
            NORMAL if added.is_empty() => {
                let bytes: Vec<u8> = token.chars().map(byte_of).collect::<Option<_>>()?;
                let text = String::from_utf8(bytes).ok()?;
                (text.chars().count() == 1).then_some(text)?
            }
            CONTROL => {
                added.push(json!({
                    "id": id, "content": token, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true,
                }));
                token.clone()
            }
            _ => return None,
        };
        if vocab.insert(text, id.into()).is_some() {
            return None;
        }
    }
    (vocab.len() > added.len()).then(|| {
        json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "Fuse"},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": vocab, "merges": []},
        })
    })
}

/// The post-processor that starts every prompt with the file's BOS token where llama.cpp
/// starts one so: `tokenizer.ggml.add_bos_token`, or where the file says nothing llama.cpp's
/// own default (`default`: on for SentencePiece and Llama 3's BPE). `null` without a BOS.
pub(super) fn bos_processor(gguf: &Gguf, tokens: &[String], default: bool) -> Json {
    let add = match gguf.get("tokenizer.ggml.add_bos_token") {
        Some(Value::Bool(add)) => *add,
        _ => default,
    };
    let bos = gguf
        .get("tokenizer.ggml.bos_token_id")
        .and_then(Value::as_u64)
        .and_then(|id| Some((id, tokens.get(usize::try_from(id).ok()?)?)));
    match (add, bos) {
        (true, Some((id, bos))) => {
            let special = |type_id: u32| json!({"SpecialToken": {"id": bos, "type_id": type_id}});
            let text = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
            json!({"type": "TemplateProcessing",
                   "single": [special(0), text("A", 0)],
                   "pair": [special(0), text("A", 0), special(1), text("B", 1)],
                   "special_tokens": {bos.as_str(): {"id": bos, "ids": [id], "tokens": [bos]}}})
        }
        _ => Json::Null,
    }
}

/// The strings of the metadata array `key`.
fn strings(gguf: &Gguf, key: &str) -> Result<Vec<String>> {
    let items = gguf
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("{key} is missing"))?;
    items
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| anyhow!("{key} holds something other than strings"))
}

/// The vocabulary's tokens by id and their llama.cpp types (normal where the file gives none).
pub(super) fn token_list(gguf: &Gguf) -> Result<(Vec<String>, Vec<i32>)> {
    let tokens = strings(gguf, "tokenizer.ggml.tokens")?;
    let types: Vec<i32> = match gguf
        .get("tokenizer.ggml.token_type")
        .and_then(Value::as_array)
    {
        Some(items) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| i32::try_from(t).ok())
                    .unwrap_or(NORMAL)
            })
            .collect(),
        None => vec![NORMAL; tokens.len()],
    };
    if types.len() != tokens.len() {
        bail!(
            "tokenizer.ggml.token_type has {} entries for {} tokens",
            types.len(),
            tokens.len()
        );
    }
    Ok((tokens, types))
}

/// Where a GGUF file's tokenizer cannot be read, the way around it.
pub(super) const AROUND: &str = "pass --tokenizer with the model's Hugging Face tokenizer.json";

/// The tokenizer of a GGUF file's byte-level BPE (`gpt2`) metadata, with a pre-tokenizer read
/// here. Anything else is an error naming it, and the way around it.
pub fn tokenizer(gguf: &Gguf) -> Result<Tokenizer> {
    let around = AROUND;
    let text = |key: &str| gguf.get(key).and_then(Value::as_str);
    // Without one, llama.cpp splits text by its "default" rule, unlike any read here: reading
    // the file as gpt-2 would tokenize some texts differently from llama.cpp.
    let pre = text("tokenizer.ggml.pre").ok_or_else(|| {
        anyhow!(
            "it names no pre-tokenizer (tokenizer.ggml.pre), so llama.cpp splits its text by a \
             rule tinygpt does not read: {around}"
        )
    })?;
    let pre_tokenizer = super::pre::hf_form(pre).ok_or_else(|| {
        anyhow!(
            "tokenizer.ggml.pre \"{pre}\" is not one tinygpt reads ({}): {around}",
            super::pre::NAMES.join(", ")
        )
    })?;
    let (tokens, types) = token_list(gguf)?;
    let merges = match gguf.get("tokenizer.ggml.merges") {
        Some(_) => strings(gguf, "tokenizer.ggml.merges")?,
        None => Vec::new(),
    };
    if pre == "gpt-2"
        && let Some(chars) = as_chars(&tokens, &types)
    {
        return Tokenizer::from_hf_value(chars).context("its tokenizer metadata");
    }
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (token, &kind)) in tokens.iter().zip(&types).enumerate() {
        if vocab.insert(token.clone(), id.into()).is_some() {
            bail!("tokenizer.ggml.tokens holds {token:?} twice");
        }
        if kind == CONTROL || kind == USER_DEFINED {
            added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": kind == CONTROL,
            }));
        }
    }
    let hf = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": pre_tokenizer,
        "post_processor": bos_processor(gguf, &tokens, pre == "llama-bpe"),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    Tokenizer::from_hf_value(hf).context("its tokenizer metadata")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        let a = byte_alphabet();
        assert_eq!(
            (a[b' ' as usize], a[b'\n' as usize], a[b'A' as usize]),
            ('Ġ', 'Ċ', 'A')
        );
        assert_eq!((a[0], a[0xC3], a[0xA9]), ('Ā', 'Ã', '©'));
        assert_eq!(a.iter().collect::<BTreeSet<_>>().len(), 256);
    }

    #[test]
    fn multi_byte_characters_get_their_merges() {
        let (tokens, merges) = char_tokens(&['\n', 'a', 'é', '—', '–']);
        let tokens: Vec<String> = tokens.into_iter().map(Option::unwrap).collect();
        assert_eq!(tokens, ["Ċ", "a", "Ã©", "âĢĶ", "âĢĵ"]);
        // The shared first merge of the two dashes is written once.
        assert_eq!(merges, ["Ã ©", "â Ģ", "âĢ Ķ", "âĢ ĵ"]);
    }

    /// An export says llama.cpp starts a prompt as tinygpt does: tinygpt's own tokenizer with
    /// nothing; read back with `add_bos_token` set, with BOS, which the next export keeps.
    #[test]
    fn add_bos_token_goes_both_ways() {
        let text = "To be, or not to be: that is the question.\n".repeat(20);
        let own = Tokenizer::train(crate::data::tokenizer::TokenizerKind::Bpe, &text, 300).unwrap();
        let all = |t: &Tokenizer| {
            [
                metadata(t, t.vocab_size()).unwrap(),
                starts_and_ends(t, None),
            ]
            .concat()
        };
        let entries = all(&own);
        let get = |entries: &[(String, Value)], key: &str| {
            entries
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let add_bos = "tokenizer.ggml.add_bos_token";
        assert!(matches!(get(&entries, add_bos), Some(Value::Bool(false))));
        let mut gguf = Gguf {
            metadata: entries,
            tensors: Vec::new(),
        };
        assert_eq!(tokenizer(&gguf).unwrap().prompt_start(), None);
        gguf.metadata.retain(|(k, _)| k != add_bos);
        gguf.metadata.push((add_bos.into(), Value::Bool(true)));
        let back = tokenizer(&gguf).unwrap();
        let bos = own.start_of_text().unwrap();
        assert_eq!(back.prompt_start(), Some(bos));
        assert_eq!(back.encode_prompt("to be").unwrap()[0], bos);
        let again = all(&back);
        assert!(matches!(get(&again, add_bos), Some(Value::Bool(true))));
        let bos_id = get(&again, "tokenizer.ggml.bos_token_id");
        assert_eq!(bos_id.and_then(|v| v.as_u64()), Some(u64::from(bos)));
    }
}
