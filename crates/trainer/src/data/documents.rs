//! Documents for `documents` batching: laid end to end in one token stream (in memory, or a
//! token file mapped from disk) with the offset where each starts, as `tinygpt prepare
//! --separator` writes them. Each starts with the tokenizer's end-of-text token (its BOS), so
//! the model learns how a text begins, as a harness's rolling perplexity asks it. A sample is one window of one document: a document longer than a
//! block is cut into consecutive windows of `block_size + 1` tokens that share their end
//! tokens, so every token after a document's first is a target exactly once.

use anyhow::{Result, bail};

use crate::data::tokenizer::Tokenizer;
use crate::data::tokens::Tokens;

/// Documents `[docs]` over a token stream, and their windows for one block size.
#[derive(Clone)]
pub struct Documents {
    tokens: Tokens,
    /// Where each document starts in `tokens`, then the end: `[docs + 1]`.
    offsets: Vec<u64>,
    /// Windows in the documents before each one, then the total: `[docs + 1]`.
    windows_before: Vec<u64>,
    block_size: usize,
}

impl Documents {
    /// Documents at `offsets` (each start, then the end of the stream) of `tokens`.
    pub fn new(tokens: Tokens, offsets: Vec<u64>, block_size: usize) -> Result<Self> {
        let ordered = offsets.first() == Some(&0) && offsets.is_sorted();
        if !ordered || offsets.last() != Some(&(tokens.len() as u64)) {
            bail!(
                "the document offsets do not fit the token file ({} tokens)",
                tokens.len()
            );
        }
        let mut windows_before = Vec::with_capacity(offsets.len());
        let mut total = 0;
        windows_before.push(0);
        for pair in offsets.windows(2) {
            total += window_count(pair[1] - pair[0], block_size);
            windows_before.push(total);
        }
        Ok(Self {
            tokens,
            offsets,
            windows_before,
            block_size,
        })
    }

    /// The documents of `text`, cut at each `separator` (newlines around a document dropped),
    /// encoded one by one, each after the start-of-text token: what `prepare --separator`
    /// writes, in memory.
    pub fn of_text(
        text: &str,
        tokenizer: &Tokenizer,
        separator: &str,
        block_size: usize,
    ) -> Result<Self> {
        let mut encoder = tokenizer.encoder();
        let mut ids = Vec::new();
        let mut offsets = vec![0];
        for doc in text.split(separator) {
            let doc = encoder.encode(doc.trim_matches('\n'))?;
            if !doc.is_empty() {
                ids.extend(encoder.start_of_text());
                ids.extend(doc);
                offsets.push(ids.len() as u64);
            }
        }
        Self::new(Tokens::from_vec(ids), offsets, block_size)
    }

    /// Documents `range` of these, as their own stream.
    pub fn part(&self, range: std::ops::Range<usize>) -> Result<Self> {
        let first = self.offsets[range.start];
        let offsets = self.offsets[range.start..=range.end]
            .iter()
            .map(|o| o - first)
            .collect();
        let len = (self.offsets[range.end] - first) as usize;
        let ids = self.tokens.slice(first as usize, len);
        Self::new(Tokens::from_vec(ids), offsets, self.block_size)
    }

    /// Where each document starts, then the end.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// The number of documents.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The number of windows (samples) over all documents.
    pub fn windows(&self) -> usize {
        *self.windows_before.last().expect("not empty") as usize
    }

    /// The block size the windows are cut for.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Tokens in all documents.
    pub fn tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Window `k` (of [`windows`](Self::windows)) as its tokens: 2..=`block_size + 1` of them.
    pub fn window(&self, k: usize) -> Vec<u32> {
        let k = k as u64;
        // The document whose windows include k: the last one with fewer windows before it.
        let doc = self.windows_before.partition_point(|&before| before <= k) - 1;
        let len = self.offsets[doc + 1] - self.offsets[doc];
        let (start, end) = window_span(k - self.windows_before[doc], len, self.block_size);
        let first = self.offsets[doc] + start;
        self.tokens.slice(first as usize, (end - start) as usize)
    }
}

/// The windows over a stream of `len` tokens: each predicts up to `block_size` targets.
pub(crate) fn window_count(len: u64, block_size: usize) -> u64 {
    len.saturating_sub(1).div_ceil(block_size as u64)
}

/// Window `k` of a stream of `len` tokens, as `(start, end)`: `block_size + 1` tokens (fewer
/// for the last), sharing its first token with the previous window's last.
pub(crate) fn window_span(k: u64, len: u64, block_size: usize) -> (u64, u64) {
    let start = k * block_size as u64;
    (start, (start + block_size as u64 + 1).min(len))
}

/// The document at which validation starts: the boundary nearest the last `val_fraction` of
/// the tokens (`offsets` as in [`Documents`]), leaving at least one document on each side.
pub(crate) fn val_start(offsets: &[u64], val_fraction: f64) -> Result<usize> {
    let docs = offsets.len().saturating_sub(1);
    if docs < 2 {
        bail!(
            "corpus too short: `documents` batching found {docs} document(s); it needs at least \
             2 (one for val)"
        );
    }
    let total = offsets[docs];
    let target = crate::data::split::train_tokens(total as usize, val_fraction) as u64;
    let nearest = (1..docs)
        .min_by_key(|&d| (offsets[d].abs_diff(target), std::cmp::Reverse(d)))
        .expect("at least two documents");
    Ok(nearest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tokenizer::TokenizerKind;
    use crate::data::tokenizer::special;

    #[test]
    fn windows_cover_each_document_once() {
        let text = "ab\n\nabcdefghij\n\n\n\nx\n\nabc\n";
        let tokenizer = Tokenizer::train(TokenizerKind::Char, text, 0).unwrap();
        let docs = Documents::of_text(text, &tokenizer, "\n\n", 4).unwrap();
        // Each document starts with the end-of-text token, so even "x" has a target (x after
        // the start); the empty piece has no token at all.
        assert_eq!(docs.offsets(), &[0, 3, 14, 16, 20]);
        assert_eq!(docs.len(), 4);
        let decode = |k| tokenizer.decode(&docs.window(k)).unwrap();
        let all: Vec<String> = (0..docs.windows()).map(decode).collect();
        let e = special::END_OF_TEXT;
        let starts = |doc: &str| format!("{e}{doc}");
        assert_eq!(
            all,
            [
                starts("ab"),
                starts("abcd"),
                "defgh".into(),
                "hij".into(),
                starts("x"),
                starts("abc")
            ]
        );
        let tail = docs.part(2..4).unwrap();
        assert_eq!(tail.offsets(), &[0, 2, 6]);
        assert_eq!(tokenizer.decode(&tail.window(1)).unwrap(), starts("abc"));
        assert!(Documents::new(Tokens::from_vec(vec![1, 2]), vec![0, 3], 4).is_err());
    }

    #[test]
    fn validation_starts_at_the_nearest_boundary() {
        assert_eq!(val_start(&[0, 2, 7, 10, 14], 0.1).unwrap(), 3);
        assert_eq!(val_start(&[0, 50, 100], 0.1).unwrap(), 1);
        assert_eq!(val_start(&[0, 10, 20, 30, 40, 100], 0.5).unwrap(), 4);
        let err = val_start(&[0, 5], 0.1).unwrap_err().to_string();
        assert!(err.contains("corpus too short"), "{err}");
    }
}
