//! The second pass: every kept input encoded, in order, into `train.bin` (or `val.bin` for
//! held-out files), chunks on every core, the token files written back to disk as they grow.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use super::chunks::{Chunks, Cut};
use super::format::{TRAIN, TRAIN_DOCS, VAL, VAL_DOCS};
use super::phases::bar;
use super::sources::Source;
use crate::checksum::hex;
use crate::data::tokenizer::{Encoder, Tokenizer};
use crate::data::tokens::Width;

/// The second pass: every kept source encoded, in order, into `train.bin` (or `val.bin` for
/// held-out files), chunks on every core. With `split_at`, the train tokens past it go on in
/// `val.bin`. Each source comes with the SHA-256 the scan read, and is hashed again as it is
/// read here: text that differs was changed meanwhile, and is refused.
pub(super) fn encode_all(
    sources: &[(&Source, &String)],
    tokenizer: &Tokenizer,
    width: Width,
    cut: &Cut,
    split_at: Option<u64>,
    dir: &Path,
    progress: bool,
) -> Result<Encoded> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total: u64 = sources.iter().map(|(s, _)| s.bytes).sum();
    let bar = bar(progress, total, "encoding");
    let mut out = Outputs::create(dir, split_at, width)?;
    // One encoder per thread, kept across batches (BPE's word cache fills once).
    let mut encoders: Vec<_> = (0..threads).map(|_| tokenizer.encoder()).collect();
    for &(source, scanned) in sources {
        let mut chunks = Chunks::new(source.open()?, cut.clone());
        let mut hasher = Sha256::new();
        let mut first = true;
        loop {
            // Each chunk, and whether it is the first of its text ([`Cut::to_encode`]).
            let mut batch = Vec::with_capacity(threads);
            while batch.len() < threads
                && let Some(chunk) = chunks.next_chunk()?
            {
                batch.push((chunk, first));
                first = false;
            }
            if batch.is_empty() {
                break;
            }
            // SHA-256 of this text, and of the tokens last written, on a core of its own
            // while the others encode.
            let encoded = std::thread::scope(|scope| {
                scope.spawn(|| {
                    batch.iter().for_each(|(c, _)| hasher.update(c.as_bytes()));
                    out.hash_written();
                });
                encode_batch(&batch, &mut encoders, width, cut)
            });
            for ((chunk, _), result) in batch.iter().zip(encoded) {
                let encoded = result.with_context(|| format!("corpus {}", source.name))?;
                out.write(source.val, encoded).with_context(|| {
                    format!("cannot write the token files in {}", dir.display())
                })?;
                bar.inc(chunk.len() as u64);
            }
        }
        if hex(&hasher.finalize()) != *scanned {
            bail!(
                "corpus {} changed while it was being prepared (its text differs between the two \
                 passes); prepare it again once nothing writes to it",
                source.name
            );
        }
    }
    out.hash_written();
    for (name, file) in [(TRAIN, out.train), (VAL, out.val)] {
        file.finish()
            .with_context(|| format!("cannot write {}", dir.join(name).display()))?;
    }
    bar.finish_and_clear();
    Ok(Encoded {
        counts: out.counts,
        offsets: cut.separator().is_some().then_some(out.offsets),
        sha256: (hex(&out.sha256.0.finalize()), hex(&out.sha256.1.finalize())),
    })
}

/// Each chunk of `batch` (and whether it is its text's first) encoded on a thread of its own,
/// with one of `encoders`.
fn encode_batch(
    batch: &[(String, bool)],
    encoders: &mut [Encoder<'_>],
    width: Width,
    cut: &Cut,
) -> Vec<Result<EncodedChunk>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = batch
            .iter()
            .zip(encoders)
            .map(|((chunk, first), encoder)| {
                let chunk = cut.to_encode(chunk, *first);
                scope.spawn(move || encode_chunk(chunk, encoder, width, cut))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The two token files being written, their token counts, and the document offsets in each
/// (both starting at 0).
struct Outputs {
    train: TokenWriter,
    val: TokenWriter,
    counts: (u64, u64),
    offsets: (Vec<u64>, Vec<u64>),
    /// Train tokens past this go on in `val.bin`.
    split_at: Option<u64>,
    width: Width,
    /// Of what was written to each file.
    sha256: (Sha256, Sha256),
    /// Chunks written but not hashed yet, each with how many of its first bytes went to
    /// `train.bin` (the rest went to `val.bin`).
    unhashed: Vec<(Vec<u8>, usize)>,
}

impl Outputs {
    /// Empty `train.bin` and `val.bin` in `dir`.
    fn create(dir: &Path, split_at: Option<u64>, width: Width) -> Result<Self> {
        Ok(Self {
            train: TokenWriter::create(dir, TRAIN)?,
            val: TokenWriter::create(dir, VAL)?,
            counts: (0, 0),
            offsets: (vec![0], vec![0]),
            split_at,
            width,
            sha256: (Sha256::new(), Sha256::new()),
            unhashed: Vec::new(),
        })
    }

    /// Appends one encoded chunk of a held-out (`val`) or training input.
    fn write(&mut self, val: bool, encoded: EncodedChunk) -> std::io::Result<()> {
        if let Some(limit) = self.split_at.filter(|_| !val) {
            let w = self.width.bytes();
            let keep = (limit.saturating_sub(self.counts.0) as usize * w).min(encoded.bytes.len());
            let (to_train, to_val) = encoded.bytes.split_at(keep);
            self.train.write_all(to_train)?;
            self.val.write_all(to_val)?;
            self.counts.0 += (keep / w) as u64;
            self.counts.1 += (to_val.len() / w) as u64;
            self.train.write_back();
            self.val.write_back();
            self.unhashed.push((encoded.bytes, keep));
            return Ok(());
        }
        let (out, count, starts) = match val {
            true => (&mut self.val, &mut self.counts.1, &mut self.offsets.1),
            false => (&mut self.train, &mut self.counts.0, &mut self.offsets.0),
        };
        out.write_all(&encoded.bytes)?;
        out.write_back();
        let mut end = *count;
        for len in encoded.documents {
            end += len;
            starts.push(end);
        }
        *count += encoded.tokens;
        let to_train = if val { 0 } else { encoded.bytes.len() };
        self.unhashed.push((encoded.bytes, to_train));
        Ok(())
    }

    /// Brings the checksums up to what was written.
    fn hash_written(&mut self) {
        for (bytes, to_train) in self.unhashed.drain(..) {
            self.sha256.0.update(&bytes[..to_train]);
            self.sha256.1.update(&bytes[to_train..]);
        }
    }
}

/// A token file being written. The disk writes while encoding goes on: without that, a
/// prepare of gigabytes left all of its output to the final `fsync` (the kernel starts writing
/// back only past a share of RAM), which then took as long as the encoding itself.
pub(super) struct TokenWriter {
    pub(super) file: File,
    pub(super) written: u64,
    /// Bytes before this offset have been handed to the disk.
    pub(super) handed: u64,
}

impl TokenWriter {
    /// Bytes written between two write-backs.
    const STRIDE: u64 = 8 << 20;

    /// A new empty file `name` in `dir`.
    pub(super) fn create(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(name);
        let file =
            File::create(&path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Self {
            file,
            written: 0,
            handed: 0,
        })
    }

    pub(super) fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Starts writing back what was written since the last call, once it is a stride's worth;
    /// returns at once.
    pub(super) fn write_back(&mut self) {
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
    pub(super) fn finish(self) -> std::io::Result<()> {
        self.file.sync_all()
    }
}

/// What [`encode_all`] wrote.
pub(super) struct Encoded {
    /// Tokens in (train.bin, val.bin).
    pub(super) counts: (u64, u64),
    /// With a separator: where each document starts in each file, then the end.
    pub(super) offsets: Option<(Vec<u64>, Vec<u64>)>,
    /// The SHA-256 of (train.bin, val.bin) as written.
    pub(super) sha256: (String, String),
}

/// One chunk encoded.
pub(super) struct EncodedChunk {
    pub(super) tokens: u64,
    pub(super) bytes: Vec<u8>,
    /// With a separator: the length of each document (of at least one token), in order.
    pub(super) documents: Vec<u64>,
}

/// Encodes `chunk` into token file bytes: whole, or document by document when `cut` has a
/// separator (the chunk then holds whole documents).
pub(super) fn encode_chunk(
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
            // Each document after the start-of-text token, as `Documents::of_text` writes it.
            let start = encoder.start_of_text();
            for doc in chunk.split(separator) {
                let mut ids = encoder.encode(doc.trim_matches('\n'))?;
                if !ids.is_empty() {
                    ids.splice(0..0, start);
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
pub(super) fn write_documents(
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
        crate::fs::write_atomic(&dir.join(name), &bytes)?;
    }
    Ok((train.len() as u64 - 1, val.len() as u64 - 1))
}

#[cfg(test)]
mod tests {
    use super::super::sources::Origin;
    use super::*;
    use crate::checksum::sha256_hex;

    /// The second pass refuses text that is not what the first pass hashed (a file written
    /// to while it was prepared), and takes the text that is.
    #[test]
    fn text_that_changed_since_the_scan_is_refused() {
        let text = "to be or not to be\n".repeat(100);
        let source = Source {
            name: "book.txt".into(),
            origin: Origin::Builtin(Box::leak(text.clone().into_boxed_str())),
            bytes: text.len() as u64,
            val: false,
        };
        let tokenizer = Tokenizer::from_char_set(text.chars().collect());
        let width = Width::for_vocab(tokenizer.vocab_size());
        let encode = |scanned: &String| {
            let dir = tempfile::tempdir().unwrap();
            encode_all(
                &[(&source, scanned)],
                &tokenizer,
                width,
                &Cut::Anywhere,
                None,
                dir.path(),
                false,
            )
            .map(|encoded| encoded.counts)
        };
        assert_eq!(
            encode(&sha256_hex(text.as_bytes())).unwrap(),
            (text.len() as u64, 0)
        );
        let other = sha256_hex(b"what the scan read before the file changed");
        let error = format!("{:#}", encode(&other).unwrap_err());
        assert!(
            error.contains("corpus book.txt changed while it was being prepared"),
            "{error}"
        );
    }
}
