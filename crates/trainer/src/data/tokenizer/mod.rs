//! Text to token ids and back: characters (nanoGPT's `stoi`/`itos`) or byte-level BPE trained
//! with Hugging Face `tokenizers`. Saved with the checkpoint as `tokenizer.json`.

use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::config::TokenizerKind;
use crate::data::byte_level_bpe::{self, BpeEncoder};

/// A trained tokenizer.
pub enum Tokenizer {
    /// One token per distinct character of the training corpus, ids in sorted order: exactly
    /// the ids nanoGPT's `prepare.py` builds (`chars = sorted(set(text))`).
    Char {
        itos: Vec<char>,
        stoi: HashMap<char, u32>,
        /// `stoi` for ASCII, a table (`u32::MAX` = absent): most text is ASCII.
        ascii: Box<[u32; 128]>,
    },
    /// Byte-level BPE: any text encodes (unseen characters fall back to their bytes).
    Bpe(Box<tokenizers::Tokenizer>),
}

/// Encodes text as [`Tokenizer::encode`] does, faster for a long stream of text: byte-level BPE
/// keeps a cache of the words it has seen ([`BpeEncoder`]).
pub struct Encoder<'a> {
    tokenizer: &'a Tokenizer,
    bpe: Option<BpeEncoder<'a>>,
}

impl Encoder<'_> {
    /// Token ids of `text`.
    pub fn encode(&mut self, text: &str) -> Result<Vec<u32>> {
        match &mut self.bpe {
            Some(bpe) => {
                let mut ids = Vec::with_capacity(text.len() / 3);
                bpe.encode(text, &mut ids)?;
                Ok(ids)
            }
            None => self.tokenizer.encode(text),
        }
    }
}

/// `tokenizer.json`: a tag, then the char table or Hugging Face's own tokenizer JSON.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum TokenizerFile {
    Char { itos: Vec<char> },
    Bpe { tokenizer: serde_json::Value },
}

impl Tokenizer {
    /// Learns a tokenizer of `kind` from `text`.
    pub fn train(kind: TokenizerKind, text: &str, bpe_vocab_size: usize) -> Result<Self> {
        match kind {
            TokenizerKind::Char => Ok(Self::from_char_set(text.chars().collect())),
            TokenizerKind::Bpe => Self::train_bpe(&[text], bpe_vocab_size),
        }
    }

    /// A char tokenizer of these characters (ids in sorted order).
    pub fn from_char_set(chars: BTreeSet<char>) -> Self {
        Self::from_chars(chars.into_iter().collect())
    }

    /// Learns byte-level BPE with `vocab_size` tokens from `chunks` (pieces of text each cut
    /// between words, e.g. at a newline).
    pub fn train_bpe<S: AsRef<str> + Sync>(chunks: &[S], vocab_size: usize) -> Result<Self> {
        Ok(Self::Bpe(Box::new(byte_level_bpe::learn(
            chunks, vocab_size,
        )?)))
    }

    fn from_chars(itos: Vec<char>) -> Self {
        let stoi: HashMap<char, u32> = itos
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        let mut ascii = Box::new([u32::MAX; 128]);
        for (&c, &id) in &stoi {
            if c.is_ascii() {
                ascii[c as usize] = id;
            }
        }
        Self::Char { itos, stoi, ascii }
    }

    /// The `data.tokenizer` setting that makes this kind of tokenizer.
    pub fn kind_setting(&self) -> TokenizerKind {
        match self {
            Self::Char { .. } => TokenizerKind::Char,
            Self::Bpe(_) => TokenizerKind::Bpe,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Self::Char { .. } => "char",
            Self::Bpe(_) => "bpe (byte-level)",
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Char { itos, .. } => itos.len(),
            Self::Bpe(t) => t.get_vocab_size(true),
        }
    }

    /// Token ids of `text`. For `char`, a character the tokenizer never saw is an error naming
    /// it and its position.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self {
            // ASCII text (most of it) through the table alone; an unknown byte falls through to
            // the general path, which names it.
            Self::Char { stoi, ascii, .. } if text.is_ascii() => {
                let ids: Vec<u32> = text.bytes().map(|b| ascii[b as usize]).collect();
                match ids.contains(&u32::MAX) {
                    false => Ok(ids),
                    true => encode_chars(stoi, ascii, text),
                }
            }
            Self::Char { stoi, ascii, .. } => encode_chars(stoi, ascii, text),
            Self::Bpe(t) => Ok(t
                .encode_fast(text, false)
                .map_err(|e| anyhow!("BPE encoding failed: {e}"))?
                .get_ids()
                .to_vec()),
        }
    }

    /// An encoder for long texts, with its own state (BPE: a word cache); one per thread.
    pub fn encoder(&self) -> Encoder<'_> {
        Encoder {
            tokenizer: self,
            bpe: match self {
                Self::Bpe(t) => BpeEncoder::new(t),
                Self::Char { .. } => None,
            },
        }
    }

    /// The text of one token, as an API shows it beside the token (empty for an id outside the
    /// vocabulary; a byte-level token that ends inside a character shows U+FFFD).
    pub fn piece(&self, id: u32) -> String {
        self.decode(&[id]).unwrap_or_default()
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Self::Char { itos, .. } => ids
                .iter()
                .map(|&id| {
                    itos.get(id as usize)
                        .copied()
                        .ok_or_else(|| anyhow!("token id {id} is outside the vocabulary"))
                })
                .collect(),
            Self::Bpe(t) => t
                .decode(ids, false)
                .map_err(|e| anyhow!("BPE decoding failed: {e}")),
        }
    }

    /// Units of text token `id` stands for: 1 character (char) or its bytes (byte-level BPE,
    /// whose token strings spell one byte per character).
    pub fn units(&self, id: u32) -> usize {
        match self {
            Self::Char { .. } => 1,
            Self::Bpe(t) => t.id_to_token(id).map_or(1, |s| s.chars().count()),
        }
    }

    /// Name of the unit [`units`](Self::units) counts.
    pub fn unit(&self) -> &'static str {
        match self {
            Self::Char { .. } => "character",
            Self::Bpe(_) => "byte",
        }
    }

    /// The char table (`itos`), for nanoGPT's meta.pkl maps; `None` for BPE.
    pub fn chars(&self) -> Option<&[char]> {
        match self {
            Self::Char { itos, .. } => Some(itos),
            Self::Bpe(_) => None,
        }
    }

    /// A Hugging Face `tokenizer.json` file. One that spells a char vocabulary (as
    /// [`to_hf_json`](Self::to_hf_json) writes it) becomes a char tokenizer again, so unknown
    /// characters stay errors.
    pub fn from_hf_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        // JSON first: `tokenizers` panics on a syntax error inside `decoder` when it parses
        // the text itself.
        let tokenizer = serde_json::from_str(&text)
            .and_then(serde_json::from_value::<tokenizers::Tokenizer>)
            .map_err(|e| {
                anyhow!(
                    "{} is not a Hugging Face tokenizer.json ({e})",
                    path.display()
                )
            })?;
        Ok(match char_vocabulary(&tokenizer) {
            Some(itos) => Self::from_chars(itos),
            None => Self::Bpe(Box::new(tokenizer)),
        })
    }

    /// This tokenizer as a Hugging Face `tokenizer.json`. A char vocabulary is written as a
    /// BPE model without merges or pre-tokenizer (each character is one token, its id
    /// tinygpt's) and a `Fuse` decoder (ids back to text with nothing between).
    pub fn to_hf_json(&self) -> Result<String> {
        let value = match self {
            Self::Bpe(t) => serde_json::to_value(t.as_ref())?,
            Self::Char { itos, .. } => {
                let vocab: serde_json::Map<String, serde_json::Value> = itos
                    .iter()
                    .enumerate()
                    .map(|(id, c)| (c.to_string(), id.into()))
                    .collect();
                serde_json::json!({
                    "version": "1.0",
                    "truncation": null,
                    "padding": null,
                    "added_tokens": [],
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

    pub fn to_json(&self) -> Result<String> {
        let file = match self {
            Self::Char { itos, .. } => TokenizerFile::Char { itos: itos.clone() },
            Self::Bpe(t) => TokenizerFile::Bpe {
                tokenizer: serde_json::to_value(t.as_ref())?,
            },
        };
        Ok(serde_json::to_string_pretty(&file)?)
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let file: TokenizerFile =
            serde_json::from_str(text).context("tokenizer.json is invalid")?;
        match file {
            TokenizerFile::Char { itos } => {
                if itos.is_empty() {
                    bail!("tokenizer.json has an empty vocabulary");
                }
                Ok(Self::from_chars(itos))
            }
            TokenizerFile::Bpe { tokenizer } => Ok(Self::Bpe(Box::new(
                serde_json::from_value(tokenizer)
                    .context("tokenizer.json: invalid BPE tokenizer")?,
            ))),
        }
    }
}

/// The characters, by id, of a tokenizer that is a char vocabulary: BPE without merges,
/// normalizer or pre-tokenizer, a `Fuse` decoder, and one character per token.
fn char_vocabulary(tokenizer: &tokenizers::Tokenizer) -> Option<Vec<char>> {
    let value = serde_json::to_value(tokenizer).ok()?;
    let model = value.get("model")?;
    let plain = model.get("type")? == "BPE"
        && model.get("merges")?.as_array()?.is_empty()
        && value.get("normalizer")?.is_null()
        && value.get("pre_tokenizer")?.is_null()
        && value.get("decoder")?.get("type")? == "Fuse"
        && value.get("added_tokens")?.as_array()?.is_empty();
    if !plain {
        return None;
    }
    let vocab = model.get("vocab")?.as_object()?;
    let mut itos = vec![None; vocab.len()];
    for (token, id) in vocab {
        let mut chars = token.chars();
        let (Some(c), None) = (chars.next(), chars.next()) else {
            return None;
        };
        *itos.get_mut(usize::try_from(id.as_u64()?).ok()?)? = Some(c);
    }
    itos.into_iter().collect()
}

/// [`Tokenizer::encode`] for `char`, a character at a time; the error names the first
/// character without an id and its position.
fn encode_chars(stoi: &HashMap<char, u32>, ascii: &[u32; 128], text: &str) -> Result<Vec<u32>> {
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            let id = match c.is_ascii() {
                true => Some(ascii[c as usize]).filter(|&id| id != u32::MAX),
                false => stoi.get(&c).copied(),
            };
            id.ok_or_else(|| {
                anyhow!(
                    "character {c:?} (position {i}) never occurs in the training corpus, so the \
                     char tokenizer has no id for it"
                )
            })
        })
        .collect()
}

/// Tokens to text as they come. Byte-level BPE tokens can end inside a character: tokens are
/// held back until they decode cleanly, and only the held-back tail is decoded per token.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    pending: Vec<u32>,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// The text that `id` completes, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        self.pending.push(id);
        let text = self.tokenizer.decode(&self.pending).ok()?;
        if text.ends_with('\u{FFFD}') {
            return None;
        }
        self.pending.clear();
        Some(text)
    }

    /// What is left at the end: the text of tokens that never completed a character (with
    /// U+FFFD for the missing bytes), if any.
    pub fn finish(&mut self) -> Option<String> {
        let pending = std::mem::take(&mut self.pending);
        (!pending.is_empty()).then(|| self.tokenizer.decode(&pending).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn char_vocabularies_round_trip_through_hugging_face_json() {
        let t = Tokenizer::train(TokenizerKind::Char, "Hello,\n wörld!", 0).unwrap();
        let json = t.to_hf_json().unwrap();
        // The tokenizers crate reads it and gives tinygpt's ids and text.
        let hf: tokenizers::Tokenizer = serde_json::from_str(&json).unwrap();
        let text = "wörld,\nHello !";
        let ids = hf.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(ids, t.encode(text).unwrap());
        assert_eq!(hf.decode(&ids, false).unwrap(), text);
        // And it is read back as a char tokenizer.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, &json).unwrap();
        let back = Tokenizer::from_hf_file(&path).unwrap();
        assert_eq!(back.chars(), t.chars());
        // A BPE tokenizer stays BPE.
        let bpe = Tokenizer::train(TokenizerKind::Bpe, &"the cat sat. ".repeat(40), 270).unwrap();
        std::fs::write(&path, bpe.to_hf_json().unwrap()).unwrap();
        let back = Tokenizer::from_hf_file(&path).unwrap();
        assert!(back.chars().is_none());
        assert_eq!(
            back.encode("the cat").unwrap(),
            bpe.encode("the cat").unwrap()
        );
    }

    #[test]
    fn char_ids_are_nanogpts_sorted_set() {
        let t = Tokenizer::train(TokenizerKind::Char, "hello world", 0).unwrap();
        assert_eq!(
            t.chars().unwrap(),
            &[' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w']
        );
        assert_eq!(t.encode("hello").unwrap(), vec![3, 2, 4, 4, 5]);
        assert_eq!(t.decode(&[3, 2, 4, 4, 5]).unwrap(), "hello");
        let err = t.encode("help").unwrap_err().to_string();
        assert!(err.contains("'p'") && err.contains("position 3"), "{err}");
        let back = Tokenizer::from_json(&t.to_json().unwrap()).unwrap();
        assert_eq!(back.chars(), t.chars());
        // Text that is not all ASCII takes the character-by-character path: same ids.
        let accented = Tokenizer::train(TokenizerKind::Char, "héllo world", 0).unwrap();
        assert_eq!(accented.encode("hé").unwrap(), vec![2, 7]);
        let err = accented.encode("he").unwrap_err().to_string();
        assert!(err.contains("'e' (position 1)"), "{err}");
    }

    #[test]
    fn bpe_round_trips_any_text_and_merges() {
        let corpus = "the cat sat on the mat. the cat ate the rat.\n".repeat(50);
        let t = Tokenizer::train(TokenizerKind::Bpe, &corpus, 300).unwrap();
        assert!(
            t.vocab_size() > 256 && t.vocab_size() <= 300,
            "{}",
            t.vocab_size()
        );
        let ids = t.encode("the cat").unwrap();
        assert!(ids.len() < "the cat".len(), "merges shorten text: {ids:?}");
        // Characters never seen in training still encode, through their bytes.
        for text in ["the cat", "Zebra ünïcödé ✓"] {
            assert_eq!(t.decode(&t.encode(text).unwrap()).unwrap(), text);
        }
        let back = Tokenizer::from_json(&t.to_json().unwrap()).unwrap();
        assert_eq!(
            back.encode("the rat").unwrap(),
            t.encode("the rat").unwrap()
        );
    }
}
