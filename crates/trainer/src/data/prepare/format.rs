//! The prepared directory (`tinygpt prepare`'s output, and a run's `data/`):
//!
//! ```text
//! DIR/
//!   train.bin       the training tokens, little-endian u16 (u32 for vocabularies over 65,536)
//!   val.bin         the validation tokens
//!   tokenizer.json  the tokenizer that made them
//!   meta.json       token counts, width, the inputs with their sizes and SHA-256, the settings,
//!                   the SHA-256 of the files here
//!   train.docs.bin  with --separator: where each document starts in train.bin (u64 token
//!   val.docs.bin    offsets, little-endian), then the end; of conversations: where each
//!                   conversation starts
//!   train.taught.bin  of conversations (`.jsonl` inputs): one byte per token, 1 where the
//!   val.taught.bin    model is taught to write it (the replies), else 0
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::chat::ChatSection;
use crate::data::conversations::mask::Mask;
use crate::data::conversations::{self, Conversations, Store, Summary};
use crate::data::documents::Documents;
use crate::data::tokenizer::Tokenizer;
use crate::data::tokenizer::TokenizerKind;
use crate::data::tokens::{Tokens, Width};

pub const TRAIN: &str = "train.bin";

pub const VAL: &str = "val.bin";

pub const META: &str = "meta.json";

pub const TOKENIZER: &str = "tokenizer.json";

pub const TRAIN_DOCS: &str = "train.docs.bin";

pub const VAL_DOCS: &str = "val.docs.bin";

pub const TRAIN_TAUGHT: &str = "train.taught.bin";

pub const VAL_TAUGHT: &str = "val.taught.bin";

/// Conversations, as `meta.json` records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationsMeta {
    /// The chat template they were rendered with: a run training on them writes and serves
    /// its conversations the same way.
    pub chat: ChatSection,
    /// Conversations in each split.
    pub train: u64,
    pub val: u64,
    /// Tokens marked taught in each split (before any cut to a block size).
    pub train_taught: u64,
    pub val_taught: u64,
}

/// One input as recorded in `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputMeta {
    pub path: String,
    pub bytes: u64,
    pub sha256: String,
    /// `train` or `val`.
    pub split: String,
}

/// `meta.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Meta {
    /// The layout's version.
    pub format: u32,
    /// `char` or `bpe`.
    pub tokenizer: TokenizerKind,
    pub vocab_size: usize,
    pub width: Width,
    pub train_tokens: u64,
    pub val_tokens: u64,
    /// The validation split: the last `val_fraction` of the stream, or `val_files`.
    pub val_fraction: Option<f64>,
    pub val_files: Vec<String>,
    /// What BPE was learned from, when it was learned here: bytes sampled of the corpus.
    pub bpe_sample_bytes: Option<u64>,
    pub inputs: Vec<InputMeta>,
    /// Inputs skipped with `--skip-invalid`, and why.
    pub skipped: Vec<(String, String)>,
    /// With `--separator`: the separator and the documents in each split (their offsets are
    /// in `train.docs.bin` and `val.docs.bin`).
    #[serde(default)]
    pub separator: Option<String>,
    #[serde(default)]
    pub train_documents: Option<u64>,
    #[serde(default)]
    pub val_documents: Option<u64>,
    /// Of `.jsonl` inputs: the conversations (where each starts is in `train.docs.bin` and
    /// `val.docs.bin`, what is taught in `train.taught.bin` and `val.taught.bin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversations: Option<ConversationsMeta>,
    /// The SHA-256 of each token file (and offsets file) by name, checked by
    /// [`super::verify()`]; empty in directories prepared before tinygpt recorded them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sha256: BTreeMap<String, String>,
}

impl Meta {
    /// Documents or conversations in (train, val), each `None` for a stream of text.
    pub fn rows(&self) -> [Option<u64>; 2] {
        match (&self.conversations, &self.separator) {
            (Some(c), _) => [Some(c.train), Some(c.val)],
            (None, Some(_)) => [self.train_documents, self.val_documents],
            (None, None) => [None, None],
        }
    }
}

/// A prepared directory.
pub struct Prepared {
    pub dir: PathBuf,
    pub meta: Meta,
    pub tokenizer: Tokenizer,
}

impl Prepared {
    /// Whether `dir` looks like a prepared directory (it has a `meta.json`).
    pub fn is_prepared(dir: &Path) -> bool {
        dir.is_dir() && dir.join(META).is_file()
    }

    /// Opens a prepared directory, checking that its files agree with `meta.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .with_context(|| format!("cannot read {}", dir.join(name).display()))
        };
        let meta: Meta = serde_json::from_str(&read(META)?)
            .with_context(|| format!("{} is invalid", dir.join(META).display()))?;
        let tokenizer = Tokenizer::from_json(&read(TOKENIZER)?)
            .with_context(|| format!("{}", dir.join(TOKENIZER).display()))?;
        if tokenizer.vocab_size() != meta.vocab_size
            || Width::for_vocab(meta.vocab_size) != meta.width
        {
            bail!(
                "{}: the token files are for a vocabulary of {} ({:?}) but tokenizer.json has {} \
                 tokens (prepare it again)",
                dir.display(),
                meta.vocab_size,
                meta.width,
                tokenizer.vocab_size()
            );
        }
        for (name, tokens) in [(TRAIN, meta.train_tokens), (VAL, meta.val_tokens)] {
            let path = dir.join(name);
            let bytes = std::fs::metadata(&path)
                .with_context(|| format!("cannot read {}", path.display()))?
                .len();
            let expected = tokens * meta.width.bytes() as u64;
            if bytes != expected {
                bail!(
                    "{} is truncated or damaged: {bytes} bytes, meta.json says {tokens} tokens \
                     ({expected} bytes)",
                    path.display()
                );
            }
        }
        let rows = [
            (TRAIN_DOCS, TRAIN_TAUGHT, meta.train_tokens),
            (VAL_DOCS, VAL_TAUGHT, meta.val_tokens),
        ];
        for ((docs, taught, tokens), count) in rows.into_iter().zip(meta.rows()) {
            let Some(count) = count else {
                continue;
            };
            let offsets = read_offsets(&dir.join(docs))?;
            if offsets.len() as u64 != count + 1 || offsets.last() != Some(&tokens) {
                bail!(
                    "{} is truncated or damaged: meta.json says {count} documents of \
                     {tokens} tokens",
                    dir.join(docs).display()
                );
            }
            if meta.conversations.is_some() {
                let path = dir.join(taught);
                let bytes = std::fs::metadata(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?
                    .len();
                if bytes != tokens {
                    bail!(
                        "{} is truncated or damaged: {bytes} bytes, meta.json says {tokens} \
                         tokens",
                        path.display()
                    );
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            tokenizer,
        })
    }

    /// The train and val conversations cut to `block_size`, or `None` when the directory holds
    /// text.
    pub fn conversations(
        &self,
        block_size: usize,
    ) -> Result<Option<(Conversations, Conversations, Summary)>> {
        if self.meta.conversations.is_none() {
            return Ok(None);
        }
        let (train, val) = self.splits()?;
        let store = |ids, docs, taught| -> Result<Store> {
            Ok(Store {
                ids,
                taught: Mask::map(&self.dir.join(taught))?,
                offsets: read_offsets(&self.dir.join(docs))?,
            })
        };
        let train = store(train, TRAIN_DOCS, TRAIN_TAUGHT)?;
        let val = store(val, VAL_DOCS, VAL_TAUGHT)?;
        let splits = conversations::from_stores(train, val, block_size)
            .with_context(|| format!("{}", self.dir.display()))?;
        Ok(Some(splits))
    }

    /// The train and val documents (for `documents` batching), or `None` when the directory
    /// was prepared without `--separator`.
    pub fn documents(&self, block_size: usize) -> Result<Option<(Documents, Documents)>> {
        if self.meta.separator.is_none() {
            return Ok(None);
        }
        let (train, val) = self.splits()?;
        let split = |tokens, name| {
            let path = self.dir.join(name);
            Documents::new(tokens, read_offsets(&path)?, block_size)
                .with_context(|| format!("{}", path.display()))
        };
        Ok(Some((split(train, TRAIN_DOCS)?, split(val, VAL_DOCS)?)))
    }

    /// The train and val token streams, mapped from disk.
    pub(crate) fn splits(&self) -> Result<(Tokens, Tokens)> {
        let width = self.meta.width;
        Ok((
            Tokens::map(&self.dir.join(TRAIN), width)?,
            Tokens::map(&self.dir.join(VAL), width)?,
        ))
    }
}

/// The document offsets in `path` (little-endian u64).
pub(super) fn read_offsets(path: &Path) -> Result<Vec<u64>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() % 8 != 0 {
        bail!("{} is truncated", path.display());
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect())
}
