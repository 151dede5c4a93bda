//! Text read in chunks of about a megabyte, each cut only where the tokenizer would cut too (at
//! a character for `char`; for BPE before a whitespace that follows a non-whitespace character,
//! where its pre-tokenizer always splits; after a separator for documents), so encoding chunk by
//! chunk gives exactly the tokens of encoding the whole text at once.

use std::io::Read;

use anyhow::{Result, bail};

use crate::data::tokenizer::Tokenizer;

/// Bytes per chunk read (a chunk grows past it only to reach a place it may be cut).
pub(super) const CHUNK: usize = 1 << 20;

/// Where a chunk of text may end, so that encoding chunk by chunk gives what encoding the
/// whole text would.
#[derive(Clone)]
pub(super) enum Cut {
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
    pub(super) fn new(tokenizer: &Tokenizer, separator: Option<&str>) -> Self {
        match (separator, tokenizer) {
            (Some(separator), _) => Self::AfterSeparator(separator.to_string()),
            (None, Tokenizer::Bpe(_)) => Self::BeforeWord,
            (None, Tokenizer::Char { .. }) => Self::Anywhere,
        }
    }

    /// The cut of the scan: between words when BPE learns from the chunks.
    pub(super) fn new_scan(learn_bpe: bool) -> Self {
        if learn_bpe {
            Self::BeforeWord
        } else {
            Self::Anywhere
        }
    }

    pub(super) fn separator(&self) -> Option<&str> {
        match self {
            Self::AfterSeparator(separator) => Some(separator),
            _ => None,
        }
    }

    /// The last place in `text` this cut allows (not 0), if any.
    pub(super) fn last_in(&self, text: &str) -> Option<usize> {
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
pub(super) struct Chunks<R: Read> {
    pub(super) reader: R,
    pub(super) buf: Vec<u8>,
    pub(super) cut: Cut,
    pub(super) done: bool,
    /// Bytes handed out so far.
    pub(super) offset: u64,
}

impl<R: Read> Chunks<R> {
    pub(super) fn new(reader: R, cut: Cut) -> Self {
        Self {
            reader,
            buf: Vec::with_capacity(2 * CHUNK),
            cut,
            done: false,
            offset: 0,
        }
    }

    pub(super) fn next_chunk(&mut self) -> Result<Option<String>> {
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
pub(super) fn word_cut(text: &str) -> Option<usize> {
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

/// Reads until `buf` is full or the reader ends; returns the bytes read.
pub(super) fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
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
}
