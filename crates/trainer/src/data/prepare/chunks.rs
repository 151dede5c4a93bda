//! Text read in chunks of about a megabyte, each cut only where the tokenizer would cut too (at
//! a character for `char`; for byte-level BPE before a whitespace that follows a
//! non-whitespace character, where its pre-tokenizer always splits; for SentencePiece-style BPE
//! at a single space between words, which is not encoded; after a separator for documents), so
//! encoding chunk by chunk gives exactly the tokens of encoding the whole text at once.

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
    /// Before a single space between two non-whitespace characters, the space left out of the
    /// next chunk's encoding: a tokenizer that puts `▁` before its text (SentencePiece's way:
    /// Llama 2, TinyLlama, Mistral) gives that chunk back the `▁` the space was in the whole
    /// text, where encoding it too would give a second one.
    BetweenWords,
    /// Right after a separator: documents are encoded one by one.
    AfterSeparator(String),
}

impl Cut {
    /// The cut for encoding with `tokenizer`, documents separated by `separator` if given.
    pub(super) fn new(tokenizer: &Tokenizer, separator: Option<&str>) -> Self {
        match (separator, tokenizer) {
            (Some(separator), _) => Self::AfterSeparator(separator.to_string()),
            (None, Tokenizer::Bpe(_)) if prepends_space(tokenizer) => Self::BetweenWords,
            (None, Tokenizer::Bpe(_)) => Self::BeforeWord,
            (None, Tokenizer::Char { .. }) => Self::Anywhere,
        }
    }

    /// The part of `chunk` to encode: all of it, but a chunk after a [`Cut::BetweenWords`]
    /// cut (not the `first` of its text) leaves out the space it starts with.
    pub(super) fn to_encode<'t>(&self, chunk: &'t str, first: bool) -> &'t str {
        match self {
            Self::BetweenWords if !first => chunk.strip_prefix(' ').unwrap_or(chunk),
            Self::Anywhere | Self::BeforeWord | Self::BetweenWords | Self::AfterSeparator(_) => {
                chunk
            }
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
            Self::BetweenWords => space_cut(text),
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

/// The last byte offset in `text` of a single space between two non-whitespace characters.
pub(super) fn space_cut(text: &str) -> Option<usize> {
    let mut chars = text.char_indices().rev().peekable();
    let mut after: Option<char> = None;
    while let Some((at, c)) = chars.next() {
        let before = chars.peek().map(|&(_, b)| b);
        let word = |c: Option<char>| c.is_some_and(|c| !c.is_whitespace());
        if c == ' ' && word(before) && word(after) {
            return Some(at);
        }
        after = Some(c);
    }
    None
}

/// Whether `tokenizer` puts `▁` before the text it encodes, so that `a b` is `a` then `b`
/// each encoded alone (SentencePiece's way); byte-level BPE encodes `b` alone without the
/// space it has after `a`.
fn prepends_space(tokenizer: &Tokenizer) -> bool {
    let encode = |text: &str| tokenizer.encode(text).ok();
    match (encode("a b"), encode("a"), encode("b")) {
        (Some(both), Some(a), Some(b)) => both == [a, b].concat(),
        _ => false,
    }
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
        for cut in [Cut::Anywhere, Cut::BeforeWord, Cut::BetweenWords, separator] {
            let pieces = chunks(&text, cut.clone());
            assert!(pieces.len() > 2, "{}", pieces.len());
            assert_eq!(pieces.concat(), text);
            for piece in &pieces[1..] {
                match &cut {
                    Cut::Anywhere => {}
                    Cut::BeforeWord => {
                        assert!(piece.starts_with(char::is_whitespace), "{:?}", &piece[..10])
                    }
                    Cut::BetweenWords => {
                        let word = |c: Option<char>| c.is_some_and(|c| !c.is_whitespace());
                        assert!(piece.starts_with(' ') && word(piece[1..].chars().next()));
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
        assert_eq!(
            space_cut("a b  c\nd"),
            Some(1),
            "two spaces and a newline: no cut"
        );
        assert_eq!(space_cut("é b"), Some(2));
        assert_eq!(space_cut("ab "), None);
    }

    /// A SentencePiece tokenizer (the GGUF fixture's, checked against llama.cpp) puts `▁`
    /// before its text: its chunks are cut between words and encode, the space left out, to
    /// the whole text's tokens (encoding the space too gives a second `▁`); a byte-level BPE
    /// is cut before words and encodes each chunk whole.
    #[test]
    fn a_sentencepiece_text_encodes_chunk_by_chunk_as_whole() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/gguf/spm/model.gguf"
        );
        let gguf = crate::interop::gguf::file::Gguf::from_bytes(&std::fs::read(path).unwrap());
        let spm = crate::interop::gguf::spm::tokenizer(&gguf.unwrap()).unwrap();
        let text = "Of Man's first  disobedience, and the fruit\n\tOf that forbidden tree, \
                    whose mortal tast Brought Death into the World, and all our woe. Ἐν ἀρχῇ";
        let cut = Cut::new(&spm, None);
        assert!(matches!(cut, Cut::BetweenWords));
        // Cut at every place the cut allows.
        let mut pieces = vec![text];
        while let Some(at) = cut.last_in(pieces[0]) {
            let (head, tail) = pieces[0].split_at(at);
            pieces.splice(0..1, [head, tail]);
        }
        assert!(pieces.len() > 20, "{}", pieces.len());
        let by_chunks: Vec<u32> = (pieces.iter().enumerate())
            .flat_map(|(i, piece)| spm.encode(cut.to_encode(piece, i == 0)).unwrap())
            .collect();
        assert_eq!(by_chunks, spm.encode(text).unwrap());
        let whole_chunks: Vec<u32> = pieces.iter().flat_map(|p| spm.encode(p).unwrap()).collect();
        assert_ne!(whole_chunks, by_chunks, "the spaces encoded too");

        let bpe = Tokenizer::train_bpe(&[text], 300).unwrap();
        assert!(matches!(Cut::new(&bpe, None), Cut::BeforeWord));
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
