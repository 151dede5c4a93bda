//! Writing files and directories so that a crash at any instant leaves the old or the new
//! version, never a mix: the primitives run directories, prepared corpora and exports are
//! written with.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `bytes` to the new file `path` and flushes it to disk.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut file =
        File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `dir` must not exist, or be an empty directory: whatever else is there is never overwritten.
pub fn refuse_non_empty(dir: &Path) -> Result<()> {
    if dir
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some())
    {
        bail!(
            "{} exists and is not empty: choose another --out (nothing was written)",
            dir.display()
        );
    }
    if dir.exists() && !dir.is_dir() {
        bail!("{} exists and is not a directory", dir.display());
    }
    Ok(())
}

/// A temporary directory beside `path` (same filesystem, so it can be renamed to it), named
/// `.NAME.PURPOSE-XXXXXX` and removed when dropped.
pub fn temp_beside(path: &Path, purpose: &str) -> Result<tempfile::TempDir> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    let parent = parent.unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    tempfile::Builder::new()
        .prefix(&format!(".{name}.{purpose}-"))
        .tempdir_in(parent)
        .with_context(|| format!("cannot create a directory in {}", parent.display()))
}

/// Puts the directory `new` in place of `dst` with two renames: an existing `dst` first
/// becomes `old` (replacing an earlier `old`), so a crash between them leaves one of the two.
/// The caller decides whether `old` stays.
pub fn swap_dir(new: &Path, dst: &Path, old: &Path) -> Result<()> {
    if dst.exists() {
        if old.exists() {
            std::fs::remove_dir_all(old)?;
        }
        std::fs::rename(dst, old)?;
    }
    std::fs::rename(new, dst).with_context(|| format!("cannot create {}", dst.display()))
}
