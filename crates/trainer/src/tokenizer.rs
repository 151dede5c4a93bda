//! Text to token ids and back: characters (nanoGPT's `stoi`/`itos`) or byte-level BPE trained
//! with Hugging Face `tokenizers`. Saved with the checkpoint as `tokenizer.json`.

use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use crate::config::TokenizerKind;

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
            TokenizerKind::Bpe => Self::train_bpe(text.split_inclusive('\n'), bpe_vocab_size),
        }
    }

    /// A char tokenizer of these characters (ids in sorted order).
    pub fn from_char_set(chars: BTreeSet<char>) -> Self {
        Self::from_chars(chars.into_iter().collect())
    }

    /// Learns byte-level BPE with `vocab_size` tokens from `lines` (pieces of text cut where
    /// its pre-tokenizer cuts, e.g. lines).
    pub fn train_bpe<'a>(
        lines: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> Result<Self> {
        let byte_level = ByteLevel::new(false, true, true);
        let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build()
            .into();
        let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
        tokenizer
            .with_pre_tokenizer(Some(byte_level))
            .with_decoder(Some(byte_level));
        // Lines keep the pre-tokenizer's work parallel and memory small.
        tokenizer
            .train(&mut trainer, lines)
            .map_err(|e| anyhow!("training the BPE tokenizer failed: {e}"))?;
        Ok(Self::Bpe(Box::new(tokenizer)))
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
            Self::Char { stoi, ascii, .. } => text
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    let id = match c.is_ascii() {
                        true => Some(ascii[c as usize]).filter(|&id| id != u32::MAX),
                        false => stoi.get(&c).copied(),
                    };
                    id.ok_or_else(|| {
                        anyhow!(
                            "character {c:?} (position {i}) never occurs in the training corpus, \
                             so the char tokenizer has no id for it"
                        )
                    })
                })
                .collect(),
            Self::Bpe(t) => Ok(t
                .encode(text, false)
                .map_err(|e| anyhow!("BPE encoding failed: {e}"))?
                .get_ids()
                .to_vec()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
