//! Which tokens of a conversations stream are taught: one byte per token (1 taught, 0 not), in
//! memory or a mask file (`train.taught.bin`, `val.taught.bin`) mapped from disk, beside the
//! token file it marks.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use memmap2::Mmap;

use crate::data::tokens::release;

/// Taught marks `[len]`.
#[derive(Clone)]
pub enum Mask {
    Memory(Arc<Vec<u8>>),
    Mapped(Arc<Mmap>),
}

impl Mask {
    pub(crate) fn from_vec(marks: Vec<u8>) -> Self {
        Self::Memory(Arc::new(marks))
    }

    /// Maps the mask file at `path`.
    pub fn map(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        if file.metadata()?.len() == 0 {
            return Ok(Self::from_vec(Vec::new()));
        }
        // SAFETY: as for token files: written once under a temporary name, renamed into place,
        // never written again.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        Ok(Self::Mapped(Arc::new(map)))
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Memory(marks) => marks.len(),
            Self::Mapped(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The marks `start..start + len`.
    pub fn marks(&self, start: usize, len: usize) -> Vec<bool> {
        self.with(|bytes| bytes[start..start + len].iter().map(|&b| b != 0).collect())
    }

    /// `read` over all the marks (a mapped file's pages released afterwards, so a pass over a
    /// large mask leaves nothing resident).
    pub fn with<R>(&self, read: impl FnOnce(&[u8]) -> R) -> R {
        match self {
            Self::Memory(marks) => read(marks),
            Self::Mapped(map) => {
                let out = read(map);
                release(map);
                out
            }
        }
    }
}
