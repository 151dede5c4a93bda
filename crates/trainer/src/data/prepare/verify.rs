//! A prepared directory's token files checked against `meta.json`: their SHA-256 (recorded by
//! `prepare`), every id below the vocabulary size, document offsets in order, taught marks 0
//! or 1. Sizes are checked when a directory opens (`Prepared::open`); this reads every byte, so
//! training runs it on a thread of its own ([`Verification`]) while it starts, and `prepare
//! --verify` on demand.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Mutex;
use std::thread::JoinHandle;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::chunks::{CHUNK, read_full};
use super::format::{Meta, TRAIN, TRAIN_DOCS, TRAIN_TAUGHT, VAL, VAL_DOCS, VAL_TAUGHT};
use crate::checksum::hex;
use crate::data::tokens::Width;

/// What a verification could check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Whether `meta.json` had checksums to compare (directories prepared before it did have
    /// none: only their ids and offsets are checked).
    pub checksums: bool,
}

/// The SHA-256 of each file `names` in `dir` that is there, by name: what `prepare` records in
/// `meta.json`.
pub fn checksums(dir: &Path, names: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut sums = BTreeMap::new();
    for &name in names {
        let path = dir.join(name);
        if path.exists() {
            sums.insert(name.to_string(), read_checked(&path, |_| Ok(()))?);
        }
    }
    Ok(sums)
}

/// Reads every token file of the prepared directory `dir`: a checksum that differs from
/// `meta.json`'s, an id outside the vocabulary or offsets out of order is an error naming the
/// file.
pub fn verify(dir: &Path, meta: &Meta) -> Result<Verified> {
    let vocab = meta.vocab_size as u64;
    let mut files = vec![(TRAIN, meta.train_tokens), (VAL, meta.val_tokens)];
    if meta.rows() != [None, None] {
        files.extend([(TRAIN_DOCS, meta.train_tokens), (VAL_DOCS, meta.val_tokens)]);
    }
    if meta.conversations.is_some() {
        files.extend([
            (TRAIN_TAUGHT, meta.train_tokens),
            (VAL_TAUGHT, meta.val_tokens),
        ]);
    }
    for (name, tokens) in files {
        let path = dir.join(name);
        let mut seen = 0u64;
        let mut last = 0u64;
        let sum = read_checked(&path, |bytes| match name {
            TRAIN | VAL => check_ids(bytes, meta.width, vocab, &mut seen),
            TRAIN_TAUGHT | VAL_TAUGHT => check_marks(bytes, &mut seen),
            _ => check_offsets(bytes, tokens, &mut last, &mut seen),
        })
        .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
        if let Some(recorded) = meta.sha256.get(name)
            && *recorded != sum
        {
            bail!(
                "{}: its SHA-256 is not the one meta.json recorded: the file was changed or \
                 damaged after it was prepared (prepare it again)",
                path.display()
            );
        }
    }
    Ok(Verified {
        checksums: !meta.sha256.is_empty(),
    })
}

/// The hex SHA-256 of the file at `path`, each chunk read handed to `check` on the way.
fn read_checked(path: &Path, mut check: impl FnMut(&[u8]) -> Result<()>) -> Result<String> {
    let mut file = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = Sha256::new();
    // Whole ids and offsets per chunk: CHUNK is a multiple of 8.
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = read_full(&mut file, &mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        std::thread::scope(|scope| {
            scope.spawn(|| hasher.update(chunk));
            check(chunk)
        })?;
    }
    Ok(hex(&hasher.finalize()))
}

/// Every id of `bytes` below `vocab`; `seen` counts the ids before them.
fn check_ids(bytes: &[u8], width: Width, vocab: u64, seen: &mut u64) -> Result<()> {
    let ids: Vec<u64> = match width {
        // The largest id first, in a loop the compiler vectorises: most chunks are clean.
        Width::U16 => {
            let max = bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .max();
            if max.is_none_or(|m| u64::from(m) < vocab) {
                *seen += (bytes.len() / 2) as u64;
                return Ok(());
            }
            bytes
                .chunks_exact(2)
                .map(|b| u64::from(u16::from_le_bytes([b[0], b[1]])))
                .collect()
        }
        Width::U32 => {
            let max = bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .max();
            if max.is_none_or(|m| u64::from(m) < vocab) {
                *seen += (bytes.len() / 4) as u64;
                return Ok(());
            }
            bytes
                .chunks_exact(4)
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect()
        }
    };
    let (at, bad) = ids
        .into_iter()
        .enumerate()
        .find(|&(_, id)| id >= vocab)
        .expect("an id out of range");
    bail!(
        "token {} is id {bad}, outside the vocabulary of {vocab}: the file is damaged (prepare \
         it again)",
        *seen + at as u64
    )
}

/// Every taught mark 0 or 1; `seen` counts the marks before these.
fn check_marks(bytes: &[u8], seen: &mut u64) -> Result<()> {
    if let Some(at) = bytes.iter().position(|&b| b > 1) {
        bail!(
            "token {}'s taught mark is {}, not 0 or 1: the file is damaged (prepare it again)",
            *seen + at as u64,
            bytes[at]
        );
    }
    *seen += bytes.len() as u64;
    Ok(())
}

/// Document offsets in order and within the split's `tokens`; `last` is the previous offset,
/// `seen` counts the offsets before these.
fn check_offsets(bytes: &[u8], tokens: u64, last: &mut u64, seen: &mut u64) -> Result<()> {
    for b in bytes.chunks_exact(8) {
        let offset = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        if offset < *last || offset > tokens {
            bail!(
                "document offset {} is {offset}, after {} and within {tokens} tokens it \
                 cannot be: the file is damaged (prepare it again)",
                *seen,
                *last
            );
        }
        *last = offset;
        *seen += 1;
    }
    Ok(())
}

/// A [`verify`] running on a thread of its own while training starts: asked without waiting
/// at every log line, and waited for before anything is written.
pub struct Verification {
    running: Mutex<Option<JoinHandle<Result<Verified>>>>,
    /// The error, once the thread has ended with one (kept for every later ask).
    failed: Mutex<Option<String>>,
}

impl Verification {
    /// Starts verifying `dir`, as `meta` describes it.
    pub fn start(dir: &Path, meta: &Meta) -> Self {
        let (dir, meta) = (dir.to_path_buf(), meta.clone());
        let handle = std::thread::Builder::new()
            .name("verify-tokens".into())
            .spawn(move || verify(&dir, &meta))
            .ok();
        Self {
            running: Mutex::new(handle),
            failed: Mutex::new(None),
        }
    }

    /// Nothing to verify (tokens in memory).
    pub fn none() -> Self {
        Self {
            running: Mutex::new(None),
            failed: Mutex::new(None),
        }
    }

    /// The verification's error if it has found one; `Ok` while it runs.
    pub(crate) fn so_far(&self) -> Result<()> {
        self.settle(false)
    }

    /// Waits for the verification; its error if it found one.
    pub fn finished(&self) -> Result<()> {
        self.settle(true)
    }

    fn settle(&self, wait: bool) -> Result<()> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.as_ref().is_some_and(|h| wait || h.is_finished())
            && let Some(handle) = running.take()
        {
            let outcome = handle
                .join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("the token files' check failed")));
            match outcome {
                Ok(Verified { checksums: false }) => eprintln!(
                    "note: this prepared corpus has no checksums (an older tinygpt prepared \
                     it): only its token ids were checked"
                ),
                Ok(_) => {}
                Err(e) => {
                    *self.failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{e:#}"))
                }
            }
        }
        match &*self.failed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => bail!("{e}"),
            None => Ok(()),
        }
    }
}
