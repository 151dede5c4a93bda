//! The inputs: files, folders (walked in path order, files matching the include patterns),
//! standard input and pipes (copied in once, so both passes can read them), the built-in corpus.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::chunks::{CHUNK, read_full};
use super::format::Meta;
use crate::checksum::hex;
use crate::config::presets;

/// File name patterns a folder's files must match by default: text files.
pub const DEFAULT_INCLUDE: &str = "*.txt,*.text,*.md,*.rst";

/// Removes the copies of standard input and pipes made in `dir`.
pub(super) fn remove_copies(sources: &[Source], dir: &Path) {
    for source in sources {
        if let Origin::File(path) = &source.origin
            && path.starts_with(dir)
        {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// One input file (or the text of a built-in corpus).
pub(super) struct Source {
    /// As the user named it (a file inside a folder: the folder's path joined with its own).
    pub(super) name: String,
    pub(super) origin: Origin,
    pub(super) bytes: u64,
    /// Held out for validation (`--val-files`).
    pub(super) val: bool,
}

pub(super) enum Origin {
    File(PathBuf),
    Builtin(&'static str),
}

impl Source {
    pub(super) fn open(&self) -> Result<Box<dyn Read + '_>> {
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
pub(super) fn sources(
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
    refuse_overlap(&sources)?;
    Ok(sources)
}

/// A held-out file that is also a training input would put the same text in both splits.
fn refuse_overlap(sources: &[Source]) -> Result<()> {
    let file = |s: &Source| match &s.origin {
        Origin::File(path) => std::fs::canonicalize(path).ok(),
        Origin::Builtin(_) => Some(PathBuf::from(&s.name)),
    };
    let train: Vec<(PathBuf, &str)> = sources
        .iter()
        .filter(|s| !s.val)
        .filter_map(|s| Some((file(s)?, s.name.as_str())))
        .collect();
    for held_out in sources.iter().filter(|s| s.val) {
        let Some(path) = file(held_out) else { continue };
        if let Some((_, name)) = train.iter().find(|(p, _)| *p == path) {
            bail!(
                "--val-files {} is also in --data (as {name}): the same text would be in both \
                 splits; leave it out of --data, or list the other files one by one",
                held_out.name
            );
        }
    }
    Ok(())
}

/// Copies a stream that can be read only once (standard input, a pipe) into `dir` as the
/// hidden file `.input-N.txt`, so both passes can read it; returns its path and size.
pub(super) fn copy_in(reader: &mut impl Read, dir: &Path, n: usize) -> Result<(PathBuf, u64)> {
    let path = dir.join(format!(".input-{n}.txt"));
    let mut file = File::create(&path)?;
    let bytes = std::io::copy(reader, &mut file)?;
    Ok((path, bytes))
}

/// The files under `dir` whose names match `include`, in path order; hidden entries skipped.
pub(super) fn walk(dir: &Path, include: &[String], out: &mut Vec<PathBuf>) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
