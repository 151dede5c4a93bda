//! The first pass: every input checked to be UTF-8 text and hashed; the characters collected
//! (char) or a sample taken (BPE).

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use sha2::{Digest, Sha256};

use super::chunks::{CHUNK, Chunks, Cut};
use super::options::{PrepareOptions, TokenizerSource};
use super::phases::bar;
use super::sources::Source;
use crate::checksum::hex;
use crate::data::tokenizer::Tokenizer;
use crate::data::tokenizer::TokenizerKind;

/// A given char tokenizer must have every character of the corpus: the error lists those it
/// lacks.
pub(super) fn check_covered(tokenizer: &Tokenizer, chars: &BTreeSet<char>) -> Result<()> {
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
pub(super) struct Scan {
    /// Per kept source, in order.
    pub(super) sha256: Vec<String>,
    pub(super) chars: BTreeSet<char>,
    pub(super) sample: Vec<String>,
    pub(super) sample_bytes: Option<u64>,
    pub(super) skipped: Vec<(String, String)>,
    /// Whether every kept source is empty or whitespace.
    pub(super) blank: bool,
    /// Characters in the kept sources, when they were collected (a char tokenizer's tokens).
    pub(super) characters: u64,
}

/// The first pass: every source is checked to be UTF-8 text and hashed; the characters are
/// collected (char) or a sample is taken (BPE).
pub(super) fn scan(sources: &[Source], options: &PrepareOptions) -> Result<Scan> {
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

/// Adds the characters of `text` to `chars`; ASCII through a table (a set insert per byte
/// would make the scan many times slower).
pub(super) fn add_chars(text: &str, chars: &mut BTreeSet<char>) {
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
