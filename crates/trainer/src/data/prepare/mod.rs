//! A corpus of any size, tokenized once into token files (nanoGPT's `prepare.py`):
//!
//! ```text
//! DIR/
//!   train.bin       the training tokens, little-endian u16 (u32 for vocabularies over 65,536)
//!   val.bin         the validation tokens
//!   tokenizer.json  the tokenizer that made them
//!   meta.json       token counts, width, the inputs with their sizes and SHA-256, the settings
//!   train.docs.bin  with --separator: where each document starts in train.bin (u64 token
//!   val.docs.bin    offsets, little-endian), then the end
//! ```
//!
//! Inputs are files, folders (recursive, files matching the include patterns, in path order) or
//! standard input. The text is streamed in chunks of about a megabyte, cut only where the
//! tokenizer would cut too (at a character for `char`; for BPE before a whitespace that follows
//! a non-whitespace character, where its pre-tokenizer always splits), so the token stream is
//! exactly what encoding the whole text at once gives. Two passes: a scan (UTF-8, checksums,
//! the character set or the BPE training sample) and the encoding, on every core. Everything is
//! written under a temporary name and renamed at the end.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::TokenizerKind;
use crate::data::train_tokens;
use crate::documents::{Documents, val_start};
use crate::integrity::hex;
use crate::presets;
use crate::tokenizer::{Encoder, Tokenizer};
use crate::tokens::{Tokens, Width};

pub const TRAIN: &str = "train.bin";
pub const VAL: &str = "val.bin";
pub const META: &str = "meta.json";
pub const TOKENIZER: &str = "tokenizer.json";
pub const TRAIN_DOCS: &str = "train.docs.bin";
pub const VAL_DOCS: &str = "val.docs.bin";

/// Bytes per chunk read (a chunk grows past it only to reach a place it may be cut).
const CHUNK: usize = 1 << 20;

/// File name patterns a folder's files must match by default: text files.
pub const DEFAULT_INCLUDE: &str = "*.txt,*.text,*.md,*.rst";

/// Where the validation split comes from.
#[derive(Debug, Clone)]
pub enum ValSplit {
    /// The last fraction of the token stream (as `train` always did).
    Fraction(f64),
    /// Whole inputs (files or folders) held out.
    Files(Vec<PathBuf>),
}

impl ValSplit {
    /// The fraction, if the split is one.
    pub fn fraction(&self) -> Option<f64> {
        match self {
            Self::Fraction(f) => Some(*f),
            Self::Files(_) => None,
        }
    }

    /// The held-out inputs (none for a fraction).
    pub fn files(&self) -> &[PathBuf] {
        match self {
            Self::Fraction(_) => &[],
            Self::Files(files) => files,
        }
    }
}

/// The tokenizer: one to learn from the corpus, or one given (a run's, when it is resumed).
pub enum TokenizerSource {
    Learn {
        kind: TokenizerKind,
        bpe_vocab_size: usize,
        /// BPE learns from evenly spaced chunks of the corpus adding up to about this much.
        bpe_sample_bytes: u64,
    },
    Given(Tokenizer),
}

/// What to prepare.
pub struct PrepareOptions {
    /// Files, folders, `-` (standard input) or a built-in corpus name.
    pub inputs: Vec<PathBuf>,
    /// Patterns (`*` = any characters) a file inside a folder must match; files named directly
    /// are always taken.
    pub include: Vec<String>,
    pub tokenizer: TokenizerSource,
    pub val: ValSplit,
    /// Skip (and list) files that are not UTF-8 text instead of stopping.
    pub skip_invalid: bool,
    /// Documents are separated by this: each is encoded on its own (the separator and the
    /// newlines around a document dropped) and where each starts is written, for `documents`
    /// batching.
    pub separator: Option<String>,
    /// Show progress bars (on a terminal).
    pub progress: bool,
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
}

/// Wall time of each pass of a prepare.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Reading, checking and hashing the inputs (and sampling them for BPE).
    pub scan: Duration,
    /// Learning the tokenizer (BPE's merges; the char table is free).
    pub learn: Duration,
    /// Encoding the inputs and writing the token files.
    pub encode: Duration,
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
        let docs = [
            (TRAIN_DOCS, meta.train_documents, meta.train_tokens),
            (VAL_DOCS, meta.val_documents, meta.val_tokens),
        ];
        for (name, documents, tokens) in docs {
            let (Some(_), Some(documents)) = (&meta.separator, documents) else {
                continue;
            };
            let offsets = read_offsets(&dir.join(name))?;
            if offsets.len() as u64 != documents + 1 || offsets.last() != Some(&tokens) {
                bail!(
                    "{} is truncated or damaged: meta.json says {documents} documents of \
                     {tokens} tokens",
                    dir.join(name).display()
                );
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            meta,
            tokenizer,
        })
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
    pub fn splits(&self) -> Result<(Tokens, Tokens)> {
        let width = self.meta.width;
        Ok((
            Tokens::map(&self.dir.join(TRAIN), width)?,
            Tokens::map(&self.dir.join(VAL), width)?,
        ))
    }
}

/// Prepares `options` into the new directory `out` (built under a temporary name beside it and
/// renamed when complete; an existing non-empty `out` is refused).
pub fn prepare(options: PrepareOptions, out: &Path) -> Result<(Prepared, Phases)> {
    crate::checkpoint::refuse_non_empty(out)?;
    if out.file_name().is_none() {
        bail!("--out {} must name a directory", out.display());
    }
    let staging = temp_beside(out)?;
    let (_, phases) = prepare_into(options, staging.path())?;
    let staging = staging.keep();
    std::fs::rename(&staging, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staging);
        anyhow::anyhow!("cannot create {}: {e}", out.display())
    })?;
    Ok((Prepared::open(out)?, phases))
}

/// A temporary directory beside `path` (same filesystem, so it can be renamed to it), removed
/// when dropped.
pub fn temp_beside(path: &Path) -> Result<tempfile::TempDir> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    tempfile::Builder::new()
        .prefix(&format!(".{name}.prepare-"))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))
}

/// Prepares `options` into `dir`, an existing empty directory.
pub fn prepare_into(options: PrepareOptions, dir: &Path) -> Result<(Meta, Phases)> {
    let started = Instant::now();
    let sources = sources(&options.inputs, options.val.files(), &options.include, dir)?;
    let mut scan = scan(&sources, &options)?;
    if scan.blank {
        match &sources[..] {
            [one] => bail!("corpus {} is empty", one.name),
            _ => bail!("the corpus is empty (no input has any text)"),
        }
    }
    if let TokenizerSource::Given(tokenizer) = &options.tokenizer {
        check_covered(tokenizer, &scan.chars)?;
    }
    let scanned = Instant::now();
    let tokenizer = learn(options.tokenizer, &scan)?;
    // The BPE sample (up to --bpe-sample-mb) is not needed while encoding.
    scan.sample = Vec::new();
    let learned = Instant::now();
    let width = Width::for_vocab(tokenizer.vocab_size());
    let kept: Vec<&Source> = sources
        .iter()
        .filter(|s| !scan.skipped.iter().any(|(p, _)| *p == s.name))
        .collect();
    let cut = Cut::new(&tokenizer, options.separator.as_deref());
    // A char tokenizer's token count is known from the scan: the validation tokens can go
    // straight to val.bin instead of being moved there afterwards.
    let split_at = match (&tokenizer, &cut, &options.val) {
        (Tokenizer::Char { .. }, Cut::Anywhere, ValSplit::Fraction(f)) => {
            Some(crate::data::train_tokens(scan.characters as usize, *f) as u64)
        }
        _ => None,
    };
    let encoded = encode_all(
        &kept,
        &tokenizer,
        width,
        &cut,
        split_at,
        dir,
        options.progress,
    )?;
    remove_copies(&sources, dir);
    let train_offsets = encoded.offsets.as_ref().map(|o| o.0.as_slice());
    let (train_tokens, val_tokens) = match split_at {
        Some(_) => encoded.counts,
        None => split_val(dir, width, &options.val, encoded.counts, train_offsets)?,
    };
    let documents = match encoded.offsets {
        Some(offsets) => Some(write_documents(dir, offsets, train_tokens)?),
        None => None,
    };
    crate::checkpoint::write_atomic(&dir.join(TOKENIZER), tokenizer.to_json()?.as_bytes())?;
    let meta = Meta {
        format: 1,
        tokenizer: tokenizer.kind_setting(),
        vocab_size: tokenizer.vocab_size(),
        width,
        train_tokens,
        val_tokens,
        val_fraction: options.val.fraction(),
        val_files: options
            .val
            .files()
            .iter()
            .map(|f| f.display().to_string())
            .collect(),
        bpe_sample_bytes: scan.sample_bytes,
        inputs: kept
            .iter()
            .zip(&scan.sha256)
            .map(|(s, sha256)| InputMeta {
                path: s.name.clone(),
                bytes: s.bytes,
                sha256: sha256.clone(),
                split: if s.val { "val" } else { "train" }.into(),
            })
            .collect(),
        skipped: scan.skipped,
        separator: options.separator.clone(),
        train_documents: documents.map(|d| d.0),
        val_documents: documents.map(|d| d.1),
    };
    let text = serde_json::to_string_pretty(&meta)?;
    crate::checkpoint::write_atomic(&dir.join(META), text.as_bytes())?;
    let phases = Phases {
        scan: scanned - started,
        learn: learned - scanned,
        encode: learned.elapsed(),
    };
    Ok((meta, phases))
}

/// The tokenizer given, or learned from what the scan found.
fn learn(source: TokenizerSource, scan: &Scan) -> Result<Tokenizer> {
    Ok(match source {
        TokenizerSource::Given(tokenizer) => tokenizer,
        TokenizerSource::Learn {
            kind: TokenizerKind::Char,
            ..
        } => Tokenizer::from_char_set(scan.chars.clone()),
        TokenizerSource::Learn {
            kind: TokenizerKind::Bpe,
            bpe_vocab_size,
            ..
        } => Tokenizer::train_bpe(&scan.sample, bpe_vocab_size)?,
    })
}

/// Removes the copies of standard input and pipes made in `dir`.
fn remove_copies(sources: &[Source], dir: &Path) {
    for source in sources {
        if let Origin::File(path) = &source.origin
            && path.starts_with(dir)
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One input file (or the text of a built-in corpus).
struct Source {
    /// As the user named it (a file inside a folder: the folder's path joined with its own).
    name: String,
    origin: Origin,
    bytes: u64,
    /// Held out for validation (`--val-files`).
    val: bool,
}

enum Origin {
    File(PathBuf),
    Builtin(&'static str),
}

impl Source {
    fn open(&self) -> Result<Box<dyn Read + '_>> {
        Ok(match &self.origin {
            Origin::File(path) => {
                Box::new(File::open(path).with_context(|| format!("cannot read {}", self.name))?)
            }
            Origin::Builtin(text) => Box::new(text.as_bytes()),
        })
    }
}

/// Whether `path` (a file, folder or built-in corpus) still holds exactly the text `meta` was
/// prepared from: the same files, sizes and SHA-256.
pub fn unchanged(meta: &Meta, path: &Path) -> Result<bool> {
    if path.as_os_str() == "-" || !meta.val_files.is_empty() || !meta.skipped.is_empty() {
        return Ok(false);
    }
    // A pipe would be consumed by looking.
    let regular = path.is_dir() || path.is_file() || presets::builtin_corpus(path).is_some();
    if !regular {
        return Ok(false);
    }
    let include: Vec<String> = DEFAULT_INCLUDE.split(',').map(String::from).collect();
    let sources = sources(&[path.to_path_buf()], &[], &include, Path::new("."))?;
    if sources.len() != meta.inputs.len() {
        return Ok(false);
    }
    for (source, recorded) in sources.iter().zip(&meta.inputs) {
        if source.name != recorded.path || source.bytes != recorded.bytes {
            return Ok(false);
        }
        let mut hasher = Sha256::new();
        let mut reader = source.open()?;
        let mut buf = vec![0; CHUNK];
        loop {
            let n = read_full(&mut reader, &mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        if hex(&hasher.finalize()) != recorded.sha256 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Every input file of `inputs` and the held-out `val_inputs`, folders walked in path order
/// (files matching `include`). Standard input and pipes are copied into `dir` first.
fn sources(
    inputs: &[PathBuf],
    val_inputs: &[PathBuf],
    include: &[String],
    dir: &Path,
) -> Result<Vec<Source>> {
    let mut sources = Vec::new();
    for (input, val) in inputs
        .iter()
        .map(|p| (p, false))
        .chain(val_inputs.iter().map(|p| (p, true)))
    {
        if let Some(text) = presets::builtin_corpus(input) {
            sources.push(Source {
                name: input.display().to_string(),
                origin: Origin::Builtin(text),
                bytes: text.len() as u64,
                val,
            });
        } else if input.as_os_str() == "-" {
            let copy = copy_in(&mut std::io::stdin().lock(), dir, sources.len())
                .context("cannot read standard input")?;
            sources.push(Source {
                name: "-".into(),
                origin: Origin::File(copy.0),
                bytes: copy.1,
                val,
            });
        } else if input.is_dir() {
            let mut files = Vec::new();
            walk(input, include, &mut files)?;
            if files.is_empty() {
                bail!(
                    "folder {} has no files matching {}",
                    input.display(),
                    include.join(",")
                );
            }
            for path in files {
                let bytes = std::fs::metadata(&path)?.len();
                sources.push(Source {
                    name: path.display().to_string(),
                    origin: Origin::File(path),
                    bytes,
                    val,
                });
            }
        } else {
            let cannot = || format!("cannot read corpus {}", input.display());
            let metadata = std::fs::metadata(input).with_context(cannot)?;
            // A pipe (`<(command)`, a FIFO) can be read only once: copied in, as stdin is.
            let (path, bytes) = match metadata.is_file() {
                true => (input.clone(), metadata.len()),
                false => copy_in(
                    &mut File::open(input).with_context(cannot)?,
                    dir,
                    sources.len(),
                )
                .with_context(cannot)?,
            };
            sources.push(Source {
                name: input.display().to_string(),
                origin: Origin::File(path),
                bytes,
                val,
            });
        }
    }
    if sources.iter().all(|s| s.val) {
        bail!("no input to train on: give --data FILE, FOLDER or - (standard input)");
    }
    Ok(sources)
}

/// Copies a stream that can be read only once (standard input, a pipe) into `dir` as the
/// hidden file `.input-N.txt`, so both passes can read it; returns its path and size.
fn copy_in(reader: &mut impl Read, dir: &Path, n: usize) -> Result<(PathBuf, u64)> {
    let path = dir.join(format!(".input-{n}.txt"));
    let mut file = File::create(&path)?;
    let bytes = std::io::copy(reader, &mut file)?;
    Ok((path, bytes))
}

/// The files under `dir` whose names match `include`, in path order; hidden entries skipped.
fn walk(dir: &Path, include: &[String], out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read folder {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            walk(&path, include, out)?;
        } else if include.iter().any(|p| matches(p, &name)) && path.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether `name` matches `pattern`, where `*` stands for any characters.
pub fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    if !name.ends_with(last) {
        return false;
    }
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// A given char tokenizer must have every character of the corpus: the error lists those it
/// lacks.
fn check_covered(tokenizer: &Tokenizer, chars: &BTreeSet<char>) -> Result<()> {
    let Some(known) = tokenizer.chars() else {
        return Ok(());
    };
    let missing: Vec<String> = chars
        .iter()
        .filter(|c| !known.contains(c))
        .map(|c| format!("{c:?}"))
        .collect();
    if !missing.is_empty() {
        let shown = missing
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        let more = missing.len().saturating_sub(20);
        bail!(
            "the corpus has {} character(s) the run's char tokenizer cannot encode: {shown}{}",
            missing.len(),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// What the scan learned.
struct Scan {
    /// Per kept source, in order.
    sha256: Vec<String>,
    chars: BTreeSet<char>,
    sample: Vec<String>,
    sample_bytes: Option<u64>,
    skipped: Vec<(String, String)>,
    /// Whether every kept source is empty or whitespace.
    blank: bool,
    /// Characters in the kept sources, when they were collected (a char tokenizer's tokens).
    characters: u64,
}

/// The first pass: every source is checked to be UTF-8 text and hashed; the characters are
/// collected (char) or a sample is taken (BPE).
fn scan(sources: &[Source], options: &PrepareOptions) -> Result<Scan> {
    let total: u64 = sources.iter().map(|s| s.bytes).sum();
    let (learn_bpe, sample_target) = match options.tokenizer {
        TokenizerSource::Learn {
            kind: TokenizerKind::Bpe,
            bpe_sample_bytes,
            ..
        } => (true, bpe_sample_bytes.max(1)),
        _ => (false, u64::MAX),
    };
    // The characters: to learn a char vocabulary, or to check a given one covers the corpus.
    let learn_chars = match &options.tokenizer {
        TokenizerSource::Learn { kind, .. } => *kind == TokenizerKind::Char,
        TokenizerSource::Given(tokenizer) => tokenizer.chars().is_some(),
    };
    // Every `stride`-th chunk goes into the sample.
    let stride = total
        .div_ceil(CHUNK as u64)
        .div_ceil(sample_target.div_ceil(CHUNK as u64));
    let stride = stride.max(1);
    let bar = bar(options.progress, total, "scanning");
    let mut scan = Scan {
        sha256: Vec::new(),
        chars: BTreeSet::new(),
        sample: Vec::new(),
        sample_bytes: learn_bpe.then_some(0),
        skipped: Vec::new(),
        blank: true,
        characters: 0,
    };
    let mut chunk_index = 0u64;
    for source in sources {
        let mut hasher = Sha256::new();
        let mut chars = BTreeSet::new();
        let mut sample = Vec::new();
        let mut characters = 0u64;
        let mut chunks = Chunks::new(source.open()?, Cut::new_scan(learn_bpe));
        let result = (|| -> Result<()> {
            while let Some(chunk) = chunks.next_chunk()? {
                bar.inc(chunk.len() as u64);
                // SHA-256 on a second core while this one looks at the characters.
                std::thread::scope(|scope| {
                    scope.spawn(|| hasher.update(chunk.as_bytes()));
                    if learn_chars {
                        add_chars(&chunk, &mut chars);
                        characters += chunk.chars().count() as u64;
                    }
                    scan.blank &= chunk.trim().is_empty();
                });
                if learn_bpe && chunk_index.is_multiple_of(stride) {
                    sample.push(chunk);
                }
                chunk_index += 1;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                scan.sha256.push(hex(&hasher.finalize()));
                scan.chars.extend(chars);
                scan.characters += characters;
                if let Some(bytes) = &mut scan.sample_bytes {
                    *bytes += sample.iter().map(|s| s.len() as u64).sum::<u64>();
                }
                scan.sample.extend(sample);
            }
            Err(e) if options.skip_invalid => {
                scan.skipped.push((source.name.clone(), format!("{e:#}")));
            }
            Err(e) => {
                return Err(e.context(format!("corpus {} is not UTF-8 text", source.name)));
            }
        }
    }
    bar.finish_and_clear();
    Ok(scan)
}

/// The second pass: every kept source encoded, in order, into `train.bin` (or `val.bin` for
/// held-out files), chunks on every core. Returns the (train, val) token counts.
fn encode_all(
    sources: &[&Source],
    tokenizer: &Tokenizer,
    width: Width,
    cut: &Cut,
    split_at: Option<u64>,
    dir: &Path,
    progress: bool,
) -> Result<Encoded> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total: u64 = sources.iter().map(|s| s.bytes).sum();
    let bar = bar(progress, total, "encoding");
    let create = |name: &str| -> Result<TokenWriter> {
        let path = dir.join(name);
        let file =
            File::create(&path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(TokenWriter::new(file))
    };
    let (mut train, mut val) = (create(TRAIN)?, create(VAL)?);
    let mut counts = (0u64, 0u64);
    // Document offsets (train, val), each starting at 0.
    let mut offsets = (vec![0u64], vec![0u64]);
    // One encoder per thread, kept across batches (BPE's word cache fills once).
    let mut encoders: Vec<_> = (0..threads).map(|_| tokenizer.encoder()).collect();
    for source in sources {
        let mut chunks = Chunks::new(source.open()?, cut.clone());
        loop {
            let mut batch = Vec::with_capacity(threads);
            while batch.len() < threads
                && let Some(chunk) = chunks.next_chunk()?
            {
                batch.push(chunk);
            }
            if batch.is_empty() {
                break;
            }
            // Each thread encodes its chunk into the file's bytes.
            let encoded: Vec<Result<EncodedChunk>> = std::thread::scope(|scope| {
                let handles: Vec<_> = batch
                    .iter()
                    .zip(&mut encoders)
                    .map(|(chunk, encoder)| {
                        scope.spawn(move || encode_chunk(chunk, encoder, width, cut))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            });
            for (chunk, result) in batch.iter().zip(encoded) {
                let encoded = result.with_context(|| format!("corpus {}", source.name))?;
                let cannot = || format!("cannot write the token files in {}", dir.display());
                match split_at {
                    // Past `split_at` train tokens, the stream goes on in val.bin.
                    Some(limit) if !source.val => {
                        let w = width.bytes();
                        let keep =
                            (limit.saturating_sub(counts.0) as usize * w).min(encoded.bytes.len());
                        let (to_train, to_val) = encoded.bytes.split_at(keep);
                        train.write_all(to_train).with_context(cannot)?;
                        val.write_all(to_val).with_context(cannot)?;
                        counts.0 += (keep / w) as u64;
                        counts.1 += (to_val.len() / w) as u64;
                        train.write_back();
                        val.write_back();
                        bar.inc(chunk.len() as u64);
                        continue;
                    }
                    _ => {}
                }
                let (out, count, starts) = if source.val {
                    (&mut val, &mut counts.1, &mut offsets.1)
                } else {
                    (&mut train, &mut counts.0, &mut offsets.0)
                };
                out.write_all(&encoded.bytes).with_context(cannot)?;
                out.write_back();
                let mut end = *count;
                for len in encoded.documents {
                    end += len;
                    starts.push(end);
                }
                *count += encoded.tokens;
                bar.inc(chunk.len() as u64);
            }
        }
    }
    for (name, file) in [(TRAIN, train), (VAL, val)] {
        file.finish()
            .with_context(|| format!("cannot write {}", dir.join(name).display()))?;
    }
    bar.finish_and_clear();
    Ok(Encoded {
        counts,
        offsets: cut.separator().is_some().then_some(offsets),
    })
}

/// A token file being written. The disk writes while encoding goes on: without that, a
/// prepare of gigabytes left all of its output to the final `fsync` (the kernel starts writing
/// back only past a share of RAM), which then took as long as the encoding itself.
struct TokenWriter {
    file: File,
    written: u64,
    /// Bytes before this offset have been handed to the disk.
    handed: u64,
}

impl TokenWriter {
    /// Bytes written between two write-backs.
    const STRIDE: u64 = 8 << 20;

    fn new(file: File) -> Self {
        Self {
            file,
            written: 0,
            handed: 0,
        }
    }

    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Starts writing back what was written since the last call, once it is a stride's worth;
    /// returns at once.
    fn write_back(&mut self) {
        if self.written - self.handed < Self::STRIDE {
            return;
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            let (from, len) = (self.handed as i64, (self.written - self.handed) as i64);
            // SAFETY: a plain system call on an open descriptor; it only schedules I/O. A
            // failure is harmless: `finish` syncs everything anyway.
            unsafe {
                libc::sync_file_range(
                    self.file.as_raw_fd(),
                    from,
                    len,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
        self.handed = self.written;
    }

    /// Everything on disk.
    fn finish(self) -> std::io::Result<()> {
        self.file.sync_all()
    }
}

/// What [`encode_all`] wrote.
struct Encoded {
    /// Tokens in (train.bin, val.bin).
    counts: (u64, u64),
    /// With a separator: where each document starts in each file, then the end.
    offsets: Option<(Vec<u64>, Vec<u64>)>,
}

/// One chunk encoded.
struct EncodedChunk {
    tokens: u64,
    bytes: Vec<u8>,
    /// With a separator: the length of each document (of at least one token), in order.
    documents: Vec<u64>,
}

/// Encodes `chunk` into token file bytes: whole, or document by document when `cut` has a
/// separator (the chunk then holds whole documents).
fn encode_chunk(
    chunk: &str,
    encoder: &mut Encoder,
    width: Width,
    cut: &Cut,
) -> Result<EncodedChunk> {
    let mut encoded = EncodedChunk {
        tokens: 0,
        bytes: Vec::new(),
        documents: Vec::new(),
    };
    let mut add = |ids: &[u32]| {
        width.encode_into(ids, &mut encoded.bytes);
        encoded.tokens += ids.len() as u64;
    };
    match cut.separator() {
        None => add(&encoder.encode(chunk)?),
        Some(separator) => {
            for doc in chunk.split(separator) {
                let ids = encoder.encode(doc.trim_matches('\n'))?;
                if !ids.is_empty() {
                    add(&ids);
                    encoded.documents.push(ids.len() as u64);
                }
            }
        }
    }
    Ok(encoded)
}

/// Writes the document offsets of both splits, the train ones cut at `train_tokens` (where
/// the validation split starts when it is a fraction of the stream); returns the number of
/// documents in each.
fn write_documents(
    dir: &Path,
    (mut train, mut val): (Vec<u64>, Vec<u64>),
    train_tokens: u64,
) -> Result<(u64, u64)> {
    if let Some(at) = train.iter().position(|&o| o == train_tokens)
        && at + 1 < train.len()
    {
        // The fraction's documents moved into val.bin: rebase their offsets.
        val = train[at..].iter().map(|o| o - train_tokens).collect();
        train.truncate(at + 1);
    }
    for (name, offsets) in [(TRAIN_DOCS, &train), (VAL_DOCS, &val)] {
        let bytes: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        crate::checkpoint::write_atomic(&dir.join(name), &bytes)?;
    }
    Ok((train.len() as u64 - 1, val.len() as u64 - 1))
}

/// The document offsets in `path` (little-endian u64).
fn read_offsets(path: &Path) -> Result<Vec<u64>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() % 8 != 0 {
        bail!("{} is truncated", path.display());
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect())
}

/// With a fraction, moves the last `fraction` of `train.bin` into `val.bin` (from the document
/// boundary nearest it, with documents); returns the final (train, val) token counts.
fn split_val(
    dir: &Path,
    width: Width,
    val: &ValSplit,
    counts: (u64, u64),
    documents: Option<&[u64]>,
) -> Result<(u64, u64)> {
    let ValSplit::Fraction(fraction) = val else {
        return Ok(counts);
    };
    let total = counts.0 as usize;
    let n = match documents {
        Some(offsets) => offsets[val_start(offsets, *fraction)?],
        None => train_tokens(total, *fraction) as u64,
    };
    let w = width.bytes() as u64;
    let train_path = dir.join(TRAIN);
    let mut train = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&train_path)?;
    {
        use std::io::{Seek, SeekFrom};
        train.seek(SeekFrom::Start(n * w))?;
        let mut val = File::create(dir.join(VAL))?;
        std::io::copy(&mut train, &mut val)?;
        val.sync_all()?;
    }
    train.set_len(n * w)?;
    train.sync_all()?;
    Ok((n, total as u64 - n))
}

/// Where a chunk of text may end, so that encoding chunk by chunk gives what encoding the
/// whole text would.
#[derive(Clone)]
enum Cut {
    /// Anywhere (at a character): char tokenizers.
    Anywhere,
    /// Before a whitespace that follows a non-whitespace character: byte-level BPE's
    /// pre-tokenizer always splits there.
    BeforeWord,
    /// Right after a separator: documents are encoded one by one.
    AfterSeparator(String),
}

impl Cut {
    /// The cut for encoding with `tokenizer`, documents separated by `separator` if given.
    fn new(tokenizer: &Tokenizer, separator: Option<&str>) -> Self {
        match (separator, tokenizer) {
            (Some(separator), _) => Self::AfterSeparator(separator.to_string()),
            (None, Tokenizer::Bpe(_)) => Self::BeforeWord,
            (None, Tokenizer::Char { .. }) => Self::Anywhere,
        }
    }

    /// The cut of the scan: between words when BPE learns from the chunks.
    fn new_scan(learn_bpe: bool) -> Self {
        if learn_bpe {
            Self::BeforeWord
        } else {
            Self::Anywhere
        }
    }

    fn separator(&self) -> Option<&str> {
        match self {
            Self::AfterSeparator(separator) => Some(separator),
            _ => None,
        }
    }

    /// The last place in `text` this cut allows (not 0), if any.
    fn last_in(&self, text: &str) -> Option<usize> {
        match self {
            Self::Anywhere => Some(text.len()),
            Self::BeforeWord => word_cut(text),
            // Matches found left to right from the chunk's start (itself right after a match),
            // as `str::split` over the whole text finds them.
            Self::AfterSeparator(separator) => text
                .match_indices(separator.as_str())
                .last()
                .map(|(at, _)| at + separator.len()),
        }
        .filter(|&at| at > 0)
    }
}

/// Text from a reader in chunks of about [`CHUNK`] bytes, each cut where [`Cut`] allows;
/// invalid UTF-8 is an error naming the byte offset.
struct Chunks<R: Read> {
    reader: R,
    buf: Vec<u8>,
    cut: Cut,
    done: bool,
    /// Bytes handed out so far.
    offset: u64,
}

impl<R: Read> Chunks<R> {
    fn new(reader: R, cut: Cut) -> Self {
        Self {
            reader,
            buf: Vec::with_capacity(2 * CHUNK),
            cut,
            done: false,
            offset: 0,
        }
    }

    fn next_chunk(&mut self) -> Result<Option<String>> {
        loop {
            if !self.done && self.buf.len() < CHUNK {
                let start = self.buf.len();
                self.buf.resize(start + CHUNK, 0);
                let read = read_full(&mut self.reader, &mut self.buf[start..])?;
                self.buf.truncate(start + read);
                self.done = read == 0;
            }
            let valid = match std::str::from_utf8(&self.buf) {
                Ok(text) => text.len(),
                Err(e) if e.error_len().is_some() || self.done => bail!(
                    "invalid UTF-8 at byte {}",
                    self.offset + e.valid_up_to() as u64
                ),
                Err(e) => e.valid_up_to(),
            };
            if let Some(at) = memchr::memchr(0, &self.buf[..valid]) {
                bail!(
                    "a NUL byte at byte {} (a binary file?)",
                    self.offset + at as u64
                );
            }
            let text = std::str::from_utf8(&self.buf[..valid]).expect("checked above");
            let cut = if self.done {
                Some(valid)
            } else if self.buf.len() < CHUNK {
                None
            } else {
                self.cut.last_in(text)
            };
            match cut {
                Some(0) if self.done => return Ok(None),
                Some(cut) if cut > 0 => {
                    let rest = self.buf.split_off(cut);
                    let chunk = std::mem::replace(&mut self.buf, rest);
                    self.offset += cut as u64;
                    return Ok(Some(String::from_utf8(chunk).expect("checked above")));
                }
                // No place to cut yet: read on (a chunk grows until it has one).
                _ => {
                    let start = self.buf.len();
                    self.buf.resize(start + CHUNK, 0);
                    let read = read_full(&mut self.reader, &mut self.buf[start..])?;
                    self.buf.truncate(start + read);
                    self.done = read == 0;
                }
            }
        }
    }
}

/// The last byte offset in `text` where a whitespace character follows a non-whitespace one.
fn word_cut(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().rev().peekable();
    while let Some((at, c)) = chars.next() {
        if c.is_whitespace()
            && chars
                .peek()
                .is_some_and(|&(_, before)| !before.is_whitespace())
        {
            return Some(at);
        }
    }
    None
}

/// Adds the characters of `text` to `chars`; ASCII through a table (a set insert per byte
/// would make the scan many times slower).
fn add_chars(text: &str, chars: &mut BTreeSet<char>) {
    // Every byte marks its slot, with no branch: non-ASCII bytes land in the upper half.
    let mut seen = [false; 256];
    for &b in text.as_bytes() {
        seen[b as usize] = true;
    }
    chars.extend((0..128u8).filter(|&b| seen[b as usize]).map(char::from));
    if !text.is_ascii() {
        chars.extend(text.chars().filter(|c| !c.is_ascii()));
    }
}

/// Reads until `buf` is full or the reader ends; returns the bytes read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(filled)
}

/// A bytes progress bar with MB/s and ETA, shown on a terminal only.
fn bar(show: bool, total: u64, what: &str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} {bar:30} {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta}",
        )
        .expect("a valid template"),
    );
    bar.set_message(what.to_string());
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(text: &str, cut: Cut) -> Vec<String> {
        let mut chunks = Chunks::new(text.as_bytes(), cut);
        std::iter::from_fn(|| chunks.next_chunk().unwrap()).collect()
    }

    #[test]
    fn chunks_cover_the_text_and_cut_only_before_words() {
        let text = "Of Man's first disobedience, and the fruit\n\n\nOf that forbidden tree "
            .repeat(40_000);
        let separator = Cut::AfterSeparator("\n\n".into());
        for cut in [Cut::Anywhere, Cut::BeforeWord, separator] {
            let pieces = chunks(&text, cut.clone());
            assert!(pieces.len() > 2, "{}", pieces.len());
            assert_eq!(pieces.concat(), text);
            for piece in &pieces[1..] {
                match &cut {
                    Cut::Anywhere => {}
                    Cut::BeforeWord => {
                        assert!(piece.starts_with(char::is_whitespace), "{:?}", &piece[..10])
                    }
                    // "\n\n\n" is cut after its first two newlines, as `split` cuts it.
                    Cut::AfterSeparator(_) => {
                        assert!(piece.starts_with("\nOf that"), "{:?}", &piece[..10])
                    }
                }
            }
        }
        assert_eq!(word_cut("ab  cd"), Some(2));
        assert_eq!(word_cut("   "), None);
    }

    #[test]
    fn invalid_text_is_an_error_with_its_offset() {
        let mut bytes = "abc".repeat(10).into_bytes();
        bytes[7] = 0xff;
        let err = Chunks::new(&bytes[..], Cut::Anywhere)
            .next_chunk()
            .unwrap_err();
        assert_eq!(err.to_string(), "invalid UTF-8 at byte 7");
        bytes[7] = 0;
        let err = Chunks::new(&bytes[..], Cut::Anywhere)
            .next_chunk()
            .unwrap_err();
        assert!(err.to_string().contains("NUL byte at byte 7"), "{err}");
    }

    #[test]
    fn patterns() {
        assert!(matches("*.txt", "a.txt"));
        assert!(!matches("*.txt", "a.txt.gz"));
        assert!(matches("*", "anything"));
        assert!(matches("data-*-*.md", "data-1-2.md"));
        assert!(!matches("data-*.md", "other-1.md"));
        assert!(matches("README", "README"));
    }
}
