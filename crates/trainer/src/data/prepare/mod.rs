//! A corpus of any size, tokenized once into token files (nanoGPT's `prepare.py`), in the
//! layout of `format.rs`:
//!
//! ```text
//! sources.rs  the inputs      -> scan.rs   first pass: UTF-8, checksums, characters or sample
//! chunks.rs   where text cuts -> encode.rs second pass: token files, on every core
//! hold_out.rs the validation split held out
//! ```
//!
//! Inputs are files, folders (recursive, files matching the include patterns, in path order) or
//! standard input. The text is streamed in chunks of about a megabyte, cut only where the
//! tokenizer would cut too (at a character for `char`; for BPE before a whitespace that follows
//! a non-whitespace character, where its pre-tokenizer always splits), so the token stream is
//! exactly what encoding the whole text at once gives. Two passes: a scan (UTF-8, checksums,
//! the character set or the BPE training sample) and the encoding, on every core. Everything is
//! written under a temporary name and renamed at the end.

mod chunks;
mod conversations;
mod encode;
mod format;
mod hold_out;
mod options;
mod phases;
mod scan;
mod sources;
mod verify;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};

use chunks::Cut;
use encode::{encode_all, write_documents};
use hold_out::split_val;
use scan::{Scan, check_covered, scan};
use sources::{Source, remove_copies, sources};

use crate::data::tokenizer::Tokenizer;
use crate::data::tokenizer::TokenizerKind;
use crate::data::tokens::Width;

pub use conversations::ConversationOptions;
pub use format::{
    ConversationsMeta, InputMeta, META, Meta, Prepared, TOKENIZER, TRAIN, TRAIN_DOCS, TRAIN_TAUGHT,
    VAL, VAL_DOCS, VAL_TAUGHT,
};
pub use hold_out::ValSplit;
pub use options::{PrepareOptions, TokenizerSource};
pub use phases::Phases;
use phases::finish;
pub use sources::{DEFAULT_INCLUDE, matches, unchanged};
pub use verify::{Verification, Verified, verify};

/// Prepares `options` into the new directory `out` (built under a temporary name beside it and
/// renamed when complete; an existing non-empty `out` is refused).
pub fn prepare(options: PrepareOptions, out: &Path) -> Result<(Prepared, Phases)> {
    let exit_on_signal = options.exit_on_signal;
    staged(out, exit_on_signal, |dir| prepare_into(options, dir))
}

/// Prepares the conversations of `options` into the new directory `out`, as [`prepare`] does
/// text (on a signal, what was written is removed and the process exits 130).
pub fn prepare_conversations(
    options: ConversationOptions,
    out: &Path,
) -> Result<(Prepared, Phases)> {
    staged(out, true, |dir| conversations::prepare_into(options, dir))
}

/// Runs `fill` on a temporary directory beside `out`, renamed to `out` when it succeeds.
fn staged(
    out: &Path,
    exit_on_signal: bool,
    fill: impl FnOnce(&Path) -> Result<(Meta, Phases)>,
) -> Result<(Prepared, Phases)> {
    crate::fs::refuse_non_empty(out)?;
    if out.file_name().is_none() {
        bail!("--out {} must name a directory", out.display());
    }
    let staging = crate::fs::temp_beside(out, "prepare")?;
    if exit_on_signal {
        crate::fs::on_signal_remove(staging.path())?;
    }
    let (_, phases) = fill(staging.path())?;
    let staging = staging.keep();
    std::fs::rename(&staging, out).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staging);
        anyhow::anyhow!("cannot create {}: {e}", out.display())
    })?;
    Ok((Prepared::open(out)?, phases))
}

/// Prepares `options` into `dir`, an existing empty directory.
pub(crate) fn prepare_into(options: PrepareOptions, dir: &Path) -> Result<(Meta, Phases)> {
    let started = Instant::now();
    let (sources, mut scan) = scan_inputs(&options, dir)?;
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
    let split_at = direct_split(&tokenizer, &cut, &options.val, scan.characters);
    let with_sums: Vec<(&Source, &String)> = kept.iter().copied().zip(&scan.sha256).collect();
    let encoded = encode_all(
        &with_sums,
        &tokenizer,
        width,
        &cut,
        split_at,
        dir,
        options.progress,
    )?;
    remove_copies(&sources, dir);
    let train_offsets = encoded.offsets.as_ref().map(|o| o.0.as_slice());
    let moved = split_at.is_none() && options.val.fraction().is_some();
    let (train_tokens, val_tokens) = match moved {
        false => encoded.counts,
        true => split_val(dir, width, &options.val, encoded.counts, train_offsets)?,
    };
    // Tokens moved from train.bin to val.bin are hashed again where they now are.
    let mut sha256 = match moved {
        false => BTreeMap::from([
            (TRAIN.to_string(), encoded.sha256.0),
            (VAL.to_string(), encoded.sha256.1),
        ]),
        true => verify::checksums(dir, &[TRAIN, VAL])?,
    };
    let documents = match encoded.offsets {
        Some(offsets) => Some(write_documents(dir, offsets, train_tokens)?),
        None => None,
    };
    crate::fs::write_atomic(&dir.join(TOKENIZER), tokenizer.to_json()?.as_bytes())?;
    let counts = Counts {
        train_tokens,
        val_tokens,
        documents,
    };
    let mut meta = meta(
        &options.val,
        &options.separator,
        &tokenizer,
        &kept,
        scan,
        counts,
    );
    sha256.append(&mut verify::checksums(dir, &[TRAIN_DOCS, VAL_DOCS])?);
    meta.sha256 = sha256;
    finish(dir, meta, [started, scanned, learned])
}

/// The inputs (copied into `dir` where they cannot be read twice) and what a first pass over
/// them found; an empty corpus, or characters a given tokenizer lacks, are errors.
fn scan_inputs(options: &PrepareOptions, dir: &Path) -> Result<(Vec<Source>, Scan)> {
    let sources = sources(&options.inputs, options.val.files(), &options.include, dir)?;
    let scan = scan(&sources, options)?;
    if scan.blank {
        match &sources[..] {
            [one] => bail!("corpus {} is empty", one.name),
            _ => bail!("the corpus is empty (no input has any text)"),
        }
    }
    if let TokenizerSource::Given(tokenizer) = &options.tokenizer {
        check_covered(tokenizer, &scan.chars)?;
    }
    Ok((sources, scan))
}

/// Where the validation tokens start, when it is known before encoding: a char tokenizer's
/// token count is the scan's character count, so its validation tokens can go straight to
/// val.bin instead of being moved there afterwards.
fn direct_split(tokenizer: &Tokenizer, cut: &Cut, val: &ValSplit, characters: u64) -> Option<u64> {
    match (tokenizer, cut, val) {
        (Tokenizer::Char { .. }, Cut::Anywhere, ValSplit::Fraction(f)) => {
            Some(crate::data::split::train_tokens(characters as usize, *f) as u64)
        }
        _ => None,
    }
}

/// What encoding and splitting counted: tokens, and documents, in each split.
struct Counts {
    train_tokens: u64,
    val_tokens: u64,
    documents: Option<(u64, u64)>,
}

/// `meta.json` for a corpus split by `val`, cut by `separator`, encoded by `tokenizer` from the
/// `kept` inputs.
fn meta(
    val: &ValSplit,
    separator: &Option<String>,
    tokenizer: &Tokenizer,
    kept: &[&Source],
    scan: Scan,
    counts: Counts,
) -> Meta {
    Meta {
        format: 1,
        tokenizer: tokenizer.kind_setting(),
        vocab_size: tokenizer.vocab_size(),
        width: Width::for_vocab(tokenizer.vocab_size()),
        train_tokens: counts.train_tokens,
        val_tokens: counts.val_tokens,
        val_fraction: val.fraction(),
        val_files: val
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
        separator: separator.clone(),
        train_documents: counts.documents.map(|d| d.0),
        val_documents: counts.documents.map(|d| d.1),
        conversations: None,
        sha256: Default::default(),
    }
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
