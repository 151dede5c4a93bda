//! The validation split: the last fraction of the token stream (from the document boundary
//! nearest it, with documents), or whole inputs held out.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::format::{TRAIN, VAL};
use crate::data::documents::val_start;
use crate::data::split::train_tokens;
use crate::data::tokens::Width;

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

/// With a fraction, moves the last `fraction` of `train.bin` into `val.bin` (from the document
/// boundary nearest it, with documents); returns the final (train, val) token counts.
pub(super) fn split_val(
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
