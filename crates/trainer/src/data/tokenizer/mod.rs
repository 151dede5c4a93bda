//! Text to token ids and back: characters (nanoGPT's `stoi`/`itos`) or byte-level BPE trained
//! with Hugging Face `tokenizers`, each with its special tokens ([`special`]). Saved with the
//! checkpoint as `tokenizer.json`.

mod hf_json;
mod prompt;
pub mod special;

use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tokenizers::ModelWrapper;

use crate::data::byte_level_bpe::{self, BpeEncoder};
use special::{Piece, Special};

/// Which tokenizer a run trains (`data.tokenizer`): characters or byte-level BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    Char,
    Bpe,
}

impl TokenizerKind {
    /// The name as TOML spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Char => "char",
            Self::Bpe => "bpe",
        }
    }
}

/// A trained tokenizer.
pub enum Tokenizer {
    /// One token per distinct character of the training corpus, ids in sorted order: exactly
    /// the ids nanoGPT's `prepare.py` builds (`chars = sorted(set(text))`).
    Char {
        itos: Vec<char>,
        stoi: HashMap<char, u32>,
        /// `stoi` for ASCII, a table (`u32::MAX` = absent): most text is ASCII.
        ascii: Box<[u32; 128]>,
        /// The special tokens, ids after the characters'.
        specials: Vec<Special>,
    },
    /// Byte-level BPE: any text encodes (unseen characters fall back to their bytes).
    Bpe(Box<Bpe>),
}

/// A Hugging Face tokenizer that never reads special tokens out of text
/// (`encode_special_tokens`), and its special tokens.
pub struct Bpe {
    hf: tokenizers::Tokenizer,
    specials: Vec<Special>,
    /// See [`Tokenizer::prompt_start`].
    prompt_start: Option<u32>,
}

impl Deref for Bpe {
    type Target = tokenizers::Tokenizer;
    fn deref(&self) -> &tokenizers::Tokenizer {
        &self.hf
    }
}

/// Encodes text as [`Tokenizer::encode`] does, faster for a long stream of text: byte-level BPE
/// keeps a cache of the words it has seen ([`BpeEncoder`]).
pub(crate) struct Encoder<'a> {
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

    /// The token a document starts with (see [`Tokenizer::start_of_text`]).
    pub fn start_of_text(&self) -> Option<u32> {
        self.tokenizer.start_of_text()
    }
}

/// `tokenizer.json`: a tag, then the char table or Hugging Face's own tokenizer JSON.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum TokenizerFile {
    Char {
        itos: Vec<char>,
        /// Special tokens' texts, ids after the characters' (none in runs made before them).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        specials: Vec<String>,
    },
    Bpe {
        tokenizer: serde_json::Value,
    },
}

impl Tokenizer {
    /// Learns a tokenizer of `kind` from `text`, with tinygpt's special tokens.
    pub fn train(kind: TokenizerKind, text: &str, bpe_vocab_size: usize) -> Result<Self> {
        match kind {
            TokenizerKind::Char => Ok(Self::from_char_set(text.chars().collect())),
            TokenizerKind::Bpe => Self::train_bpe(&[text], bpe_vocab_size),
        }
    }

    /// A char tokenizer of these characters (ids in sorted order), then tinygpt's special
    /// tokens.
    pub(crate) fn from_char_set(chars: BTreeSet<char>) -> Self {
        let specials = special::OWN.iter().map(|s| s.to_string()).collect();
        Self::from_chars(chars.into_iter().collect(), specials)
    }

    /// Learns byte-level BPE with `vocab_size` tokens in all from `chunks` (pieces of text each
    /// cut between words, e.g. at a newline): the learnt ones, then tinygpt's special tokens.
    pub(crate) fn train_bpe<S: AsRef<str> + Sync>(chunks: &[S], vocab_size: usize) -> Result<Self> {
        let learnt = vocab_size.saturating_sub(special::OWN.len());
        let mut hf = byte_level_bpe::learn(chunks, learnt)?;
        let own = special::OWN.map(|s| tokenizers::AddedToken::from(s, true));
        hf.add_special_tokens(own)
            .map_err(|e| anyhow!("adding the special tokens failed: {e}"))?;
        Ok(Self::bpe(hf))
    }

    /// `hf` as a tokenizer whose plain [`encode`](Self::encode) never gives a special token.
    fn bpe(mut hf: tokenizers::Tokenizer) -> Self {
        hf.set_encode_special_tokens(true);
        let specials = special::specials_of(&hf);
        let prompt_start = special::prompt_start(&hf, &specials);
        Self::Bpe(Box::new(Bpe {
            hf,
            specials,
            prompt_start,
        }))
    }

    fn from_chars(itos: Vec<char>, specials: Vec<String>) -> Self {
        let specials = specials
            .iter()
            .enumerate()
            .map(|(i, text)| Special::new(text, (itos.len() + i) as u32))
            .collect();
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
        Self::Char {
            itos,
            stoi,
            ascii,
            specials,
        }
    }

    /// The `data.tokenizer` setting that makes this kind of tokenizer.
    pub(crate) fn kind_setting(&self) -> TokenizerKind {
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
            Self::Char { itos, specials, .. } => itos.len() + specials.len(),
            Self::Bpe(t) => t.get_vocab_size(true),
        }
    }

    /// The special tokens, by id.
    pub fn specials(&self) -> &[Special] {
        match self {
            Self::Char { specials, .. } => specials,
            Self::Bpe(t) => &t.specials,
        }
    }

    /// The id of the special token `text`.
    pub(crate) fn special_id(&self, text: &str) -> Option<u32> {
        self.specials()
            .iter()
            .find(|s| s.text == text)
            .map(|s| s.id)
    }

    /// The token every document starts with, and an export's BOS and EOS: tinygpt's end of
    /// text, or an imported tokenizer's BOS (none in char runs made before special tokens).
    pub fn start_of_text(&self) -> Option<u32> {
        special::start_of_text(self.specials())
    }

    /// The token that ends a text: an export's EOS (tinygpt's end of text, or an imported
    /// tokenizer's EOS).
    pub(crate) fn end_of_text(&self) -> Option<u32> {
        special::end_of_text(self.specials())
    }

    /// The text of special token `id`.
    pub(crate) fn special_text(&self, id: Option<u32>) -> Option<&str> {
        let id = id?;
        self.specials()
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.text.as_str())
    }

    /// Token ids of `text`, never a special token (text that spells one is text). For `char`, a
    /// character the tokenizer never saw is an error naming it and its position.
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

    /// Token ids of `text` with each special token it spells as that token: how a rendered
    /// conversation, a prompt or a stop text is read (as transformers reads them).
    pub fn encode_with_specials(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for piece in special::pieces(text, self.specials()) {
            match piece {
                Piece::Text(text) => ids.extend(self.encode(text)?),
                Piece::Special(id) => ids.push(id),
            }
        }
        Ok(ids)
    }

    /// An encoder for long texts, with its own state (BPE: a word cache); one per thread.
    pub(crate) fn encoder(&self) -> Encoder<'_> {
        Encoder {
            tokenizer: self,
            bpe: match self {
                Self::Bpe(t) => BpeEncoder::new(&t.hf),
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
            Self::Char { itos, specials, .. } => {
                let mut text = String::with_capacity(ids.len());
                for &id in ids {
                    let i = id as usize;
                    if let Some(&c) = itos.get(i) {
                        text.push(c);
                    } else if let Some(s) = specials.get(i - itos.len()) {
                        text.push_str(&s.text);
                    } else {
                        bail!("token id {id} is outside the vocabulary");
                    }
                }
                Ok(text)
            }
            Self::Bpe(t) => t
                .decode(ids, false)
                .map_err(|e| anyhow!("BPE decoding failed: {e}")),
        }
    }

    /// Units of text token `id` stands for: 1 character (char) or its bytes (byte-level BPE,
    /// whose token strings spell one byte per character; SentencePiece's, where `▁` is a space
    /// and `<0xE3>` one byte); none for a special token.
    pub(crate) fn units(&self, id: u32) -> usize {
        if self.specials().iter().any(|s| s.id == id) {
            return 0;
        }
        let Self::Bpe(t) = self else { return 1 };
        let Some(token) = t.id_to_token(id) else {
            return 1;
        };
        match t.get_model() {
            ModelWrapper::BPE(bpe) if bpe.byte_fallback => {
                let byte = token.len() == 6 && token.starts_with("<0x") && token.ends_with('>');
                if byte {
                    1
                } else {
                    token.replace('▁', " ").len()
                }
            }
            _ => token.chars().count(),
        }
    }

    /// Name of the unit [`units`](Self::units) counts.
    pub fn unit(&self) -> &'static str {
        match self {
            Self::Char { .. } => "character",
            Self::Bpe(_) => "byte",
        }
    }

    /// The char table (`itos`, the special tokens after it), for nanoGPT's meta.pkl maps;
    /// `None` for BPE.
    pub fn chars(&self) -> Option<&[char]> {
        match self {
            Self::Char { itos, .. } => Some(itos),
            Self::Bpe(_) => None,
        }
    }

    pub fn to_json(&self) -> Result<String> {
        let file = match self {
            Self::Char { itos, specials, .. } => TokenizerFile::Char {
                itos: itos.clone(),
                specials: specials.iter().map(|s| s.text.clone()).collect(),
            },
            Self::Bpe(t) => TokenizerFile::Bpe {
                tokenizer: serde_json::to_value(&t.hf)?,
            },
        };
        Ok(serde_json::to_string_pretty(&file)?)
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let file: TokenizerFile =
            serde_json::from_str(text).context("tokenizer.json is invalid")?;
        match file {
            TokenizerFile::Char { itos, specials } => {
                if itos.is_empty() {
                    bail!("tokenizer.json has an empty vocabulary");
                }
                Ok(Self::from_chars(itos, specials))
            }
            TokenizerFile::Bpe { tokenizer } => Ok(Self::bpe(
                serde_json::from_value(tokenizer)
                    .context("tokenizer.json: invalid BPE tokenizer")?,
            )),
        }
    }
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
/// held back until they decode cleanly, and only the held-back tail is decoded per token. Each
/// is decoded after the tokens before it and only what it adds is given: a SentencePiece
/// decoder drops the space a text starts with, so `▁the` alone is `the` but ` the` after a word.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    /// The tokens whose text was given last (at first, the prompt's last token).
    context: Vec<u32>,
    pending: Vec<u32>,
}

impl<'a> TextStream<'a> {
    /// A stream of tokens that start a text.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        Self::after(tokenizer, &[])
    }

    /// A stream of tokens that continue `before` (a prompt's tokens).
    pub fn after(tokenizer: &'a Tokenizer, before: &[u32]) -> Self {
        Self {
            tokenizer,
            context: before.last().copied().into_iter().collect(),
            pending: Vec::new(),
        }
    }

    /// The text of `pending` after `context`.
    fn pending_text(&self) -> Option<String> {
        let alone = || self.tokenizer.decode(&self.pending).ok();
        if self.context.is_empty() {
            return alone();
        }
        let before = self.tokenizer.decode(&self.context).ok()?;
        let both = [&self.context[..], &self.pending[..]].concat();
        let text = self.tokenizer.decode(&both).ok()?;
        match text.strip_prefix(before.as_str()) {
            Some(added) if !before.ends_with('\u{FFFD}') => Some(added.to_string()),
            _ => alone(),
        }
    }

    /// The text that `id` completes, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        self.pending.push(id);
        let text = self.pending_text()?;
        if text.ends_with('\u{FFFD}') {
            return None;
        }
        self.context = std::mem::take(&mut self.pending);
        Some(text)
    }

    /// What is left at the end: the text of tokens that never completed a character (with
    /// U+FFFD for the missing bytes), if any.
    pub fn finish(&mut self) -> Option<String> {
        (!self.pending.is_empty()).then(|| {
            let text = self.pending_text().unwrap_or_default();
            self.pending.clear();
            text
        })
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
    fn special_tokens_are_never_read_out_of_plain_text() {
        let corpus = "<|endoftext|> the cat sat. ".repeat(40);
        for kind in [TokenizerKind::Char, TokenizerKind::Bpe] {
            let t = Tokenizer::train(kind, &corpus, 300).unwrap();
            if kind == TokenizerKind::Bpe {
                assert!(
                    t.vocab_size() <= 300,
                    "the specials are inside the size asked for"
                );
            }
            let ids: Vec<u32> = special::OWN
                .iter()
                .map(|s| t.special_id(s).unwrap())
                .collect();
            let first = t.vocab_size() - special::OWN.len();
            assert_eq!(
                ids,
                (first as u32..t.vocab_size() as u32).collect::<Vec<_>>()
            );
            let eot = ids[0];
            assert_eq!((t.start_of_text(), t.end_of_text()), (Some(eot), Some(eot)));
            // Text that spells a special token is text; read with specials, it is the token.
            let text = "the <|endoftext|>cat";
            let plain = t.encode(text).unwrap();
            assert!(
                !plain.iter().any(|id| ids.contains(id)),
                "{kind:?}: {plain:?}"
            );
            assert_eq!(t.decode(&plain).unwrap(), text);
            let marked = t.encode_with_specials(text).unwrap();
            let mut expected = t.encode("the ").unwrap();
            expected.push(eot);
            expected.extend(t.encode("cat").unwrap());
            assert_eq!(marked, expected, "{kind:?}");
            // They survive decoding, stand for no units of text, and round-trip the files.
            assert_eq!(t.decode(&marked).unwrap(), text);
            assert_eq!(t.units(eot), 0);
            let back = Tokenizer::from_json(&t.to_json().unwrap()).unwrap();
            assert_eq!(back.specials(), t.specials());
            assert_eq!(back.encode(text).unwrap(), plain);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tokenizer.json");
            std::fs::write(&path, t.to_hf_json().unwrap()).unwrap();
            let hf = Tokenizer::from_hf_file(&path).unwrap();
            assert_eq!(hf.kind(), t.kind());
            assert_eq!(hf.specials(), t.specials());
            assert_eq!(hf.encode_with_specials(text).unwrap(), marked);
        }
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
