//! A stream of token ids: in memory, or a token file (`train.bin`, `val.bin`) mapped from disk
//! so that a corpus of any size costs no memory beyond the pages a batch touches.
//!
//! Token files are little-endian `u16` (nanoGPT's layout, for vocabularies up to 65,536) or
//! `u32`, with no header.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use memmap2::Mmap;

/// The width of the ids in a token file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Width {
    U16,
    U32,
}

impl Width {
    /// The narrowest width that holds every id of a vocabulary of `vocab_size`.
    pub(crate) fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// `ids` as file bytes, appended to `out`.
    pub(crate) fn encode_into(self, ids: &[u32], out: &mut Vec<u8>) {
        let start = out.len();
        out.resize(start + ids.len() * self.bytes(), 0);
        // Fixed-size chunks of a pre-sized buffer: the compiler vectorises these loops.
        match self {
            Self::U16 => out[start..]
                .chunks_exact_mut(2)
                .zip(ids)
                .for_each(|(dst, &id)| dst.copy_from_slice(&(id as u16).to_le_bytes())),
            Self::U32 => out[start..]
                .chunks_exact_mut(4)
                .zip(ids)
                .for_each(|(dst, &id)| dst.copy_from_slice(&id.to_le_bytes())),
        }
    }
}

/// Token ids `[len]`.
#[derive(Clone)]
pub enum Tokens {
    Memory(Arc<Vec<u32>>),
    Mapped { map: Arc<Mmap>, width: Width },
}

impl Tokens {
    pub(crate) fn from_vec(ids: Vec<u32>) -> Self {
        Self::Memory(Arc::new(ids))
    }

    /// Maps the token file `path` of `width`; its size must be a whole number of ids.
    pub fn map(path: &Path, width: Width) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        if file.metadata()?.len() == 0 {
            return Ok(Self::from_vec(Vec::new()));
        }
        // SAFETY: token files are written once under a temporary name and renamed into place;
        // nothing writes them afterwards, so the mapped bytes do not change under us.
        let map = unsafe { Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        if map.len() % width.bytes() != 0 {
            bail!(
                "{} is truncated: {} bytes is not a whole number of {}-byte ids",
                path.display(),
                map.len(),
                width.bytes()
            );
        }
        // Batches read small windows at random places: without this, each fault on a cold file
        // reads ahead as much as the disk's read-ahead setting (megabytes on some machines).
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        Ok(Self::Mapped {
            map: Arc::new(map),
            width,
        })
    }

    /// Asks the kernel to start reading ids `start..start + len` from disk, for a sequential
    /// pass (an evaluation sweep) that [`map`](Self::map)'s random-access advice would
    /// otherwise read a page per fault.
    pub(crate) fn prefetch(&self, start: usize, len: usize) {
        #[cfg(unix)]
        if let Self::Mapped { map, width } = self {
            let w = width.bytes();
            let _ = map.advise_range(memmap2::Advice::WillNeed, start * w, len * w);
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Self::Memory(ids) => ids.len(),
            Self::Mapped { map, width } => map.len() / width.bytes(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids `start..start + len` as i64 appended to `out` (how batches hold them).
    pub(crate) fn extend_i64(&self, start: usize, len: usize, out: &mut Vec<i64>) {
        match self {
            Self::Memory(ids) => out.extend(ids[start..start + len].iter().map(|&t| t as i64)),
            Self::Mapped { map, width } => {
                let w = width.bytes();
                let bytes = &map[start * w..(start + len) * w];
                match width {
                    Width::U16 => out.extend(
                        bytes
                            .chunks_exact(2)
                            .map(|b| u16::from_le_bytes([b[0], b[1]]) as i64),
                    ),
                    Width::U32 => out.extend(
                        bytes
                            .chunks_exact(4)
                            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
                    ),
                }
                release(map);
            }
        }
    }

    /// The ids `start..start + len`.
    pub fn slice(&self, start: usize, len: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(len);
        self.extend_i64(start, len, &mut out);
        out.into_iter().map(|t| t as u32).collect()
    }
}

/// Unmaps the file's pages from this process once a window is read, so that resident memory
/// stays one window's worth whatever the corpus size. The kernel maps a file's page cache in
/// folios of up to megabytes around each fault (`MADV_RANDOM` does not stop that for pages
/// already cached), so without this every random window would add megabytes to the resident
/// set. The whole map is released, not only the window, because a fault maps pages beyond it;
/// unpopulated ranges cost nothing. The pages stay in the page cache: a later read maps them
/// again without touching the disk.
#[cfg(unix)]
pub(crate) fn release(map: &Mmap) {
    // SAFETY: the map is a read-only shared mapping of a file nothing writes, so MADV_DONTNEED
    // only drops page-table entries: any later read (in this thread or another) faults the same
    // bytes back in. The caller has copied what it read.
    let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
}

#[cfg(not(unix))]
pub(crate) fn release(_map: &Mmap) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_files_read_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let ids: Vec<u32> = vec![0, 1, 65535, 7, 300];
        for (width, big) in [(Width::U16, 0), (Width::U32, 70_000)] {
            let ids: Vec<u32> = ids.iter().map(|&i| i + big).collect();
            let mut bytes = Vec::new();
            width.encode_into(&ids, &mut bytes);
            let path = dir.path().join("t.bin");
            std::fs::write(&path, &bytes).unwrap();
            let mapped = Tokens::map(&path, width).unwrap();
            assert_eq!(mapped.len(), 5);
            assert_eq!(mapped.slice(1, 3), ids[1..4].to_vec());
            assert_eq!(Tokens::from_vec(ids.clone()).slice(0, 5), ids);
            std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
            let err = Tokens::map(&path, width).err().unwrap().to_string();
            assert!(err.contains("is truncated"), "{err}");
        }
    }

    /// This process's resident kB of the mapping of `path` (`/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    fn resident_kb(path: &Path) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut kb = 0;
        for line in smaps.lines() {
            if line.contains(" /") || line.ends_with(']') || line.split_whitespace().count() == 5 {
                inside = line.ends_with(&*path.to_string_lossy());
            } else if inside && let Some(rss) = line.strip_prefix("Rss:") {
                kb += rss.trim().trim_end_matches(" kB").parse::<u64>().unwrap();
            }
        }
        kb
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reading_windows_keeps_no_pages_resident() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.bin");
        let ids: Vec<u32> = (0..32u32 << 20).map(|i| i % 65).collect();
        let mut bytes = Vec::new();
        Width::U16.encode_into(&ids, &mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let tokens = Tokens::map(&path, Width::U16).unwrap();
        let mut out = Vec::new();
        // 200 windows spread over the 64 MiB file: without releasing them, each maps a folio
        // (up to megabytes) of the page cache into this process.
        for k in 0..200usize {
            let start = k * 160_001 % (ids.len() - 65);
            out.clear();
            tokens.extend_i64(start, 65, &mut out);
            let expected: Vec<i64> = ids[start..start + 65].iter().map(|&t| t as i64).collect();
            assert_eq!(out, expected);
        }
        let kb = resident_kb(&path);
        assert!(kb <= 256, "{kb} kB of the token file stay resident");
    }

    #[test]
    fn the_width_fits_the_vocabulary() {
        assert_eq!(Width::for_vocab(65), Width::U16);
        assert_eq!(Width::for_vocab(65536), Width::U16);
        assert_eq!(Width::for_vocab(65537), Width::U32);
    }
}
