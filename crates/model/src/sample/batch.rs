//! Decoding many sequences at once, a server's requests: [`BatchDecoder`], on the fused CPU
//! decoder ([`FusedBatch`](crate::FusedBatch)) and on Burn's backends
//! ([`GptBatch`](crate::GptBatch)).
//!
//! Each sequence (a *stream*) has its own KV cache and length. A step feeds some streams their
//! next token and others a piece of a prompt; the single tokens of all streams go through the
//! weights together, one row each, which reads every weight once for all of them (one stream
//! alone is a matrix-vector product that waits on memory). A longer feed goes through the
//! stream's caches as it would alone.

use tinygpt_attention::AttentionError;

use super::continuation::Continuation;
use super::decoder::{Decoder, Replay};
use super::options::GenerateOptions;
use crate::error::{GenerateError, ModelError};

/// A model decoding `streams()` sequences at once, each with its own cache.
pub trait BatchDecoder {
    /// How many streams it holds.
    fn streams(&self) -> usize;
    /// The longest context, in tokens.
    fn block_size(&self) -> usize;
    /// Token ids run from 0 to `vocab_size - 1`.
    fn vocab_size(&self) -> usize;
    /// How many tokens stream `stream`'s cache holds.
    fn cached(&self, stream: usize) -> usize;
    /// Empties stream `stream`'s cache.
    fn clear(&mut self, stream: usize);
    /// A decoder of the same weights outside the streams, for work of one sequence (scoring
    /// a prompt); what it feeds leaves the streams' caches alone.
    fn alone(&mut self) -> &mut dyn Decoder;
    /// Feeds each `(stream, tokens)` (a stream at most once, at least one token) at the
    /// positions after its cached ones, and returns the logits of the token after each feed's
    /// last, `[feeds, vocab_size]` in the feeds' order.
    fn step(&mut self, feeds: &[(usize, &[u32])]) -> Result<&[f32], ModelError>;

    /// Once a step of single tokens has been recorded for replay (a GPU): whether the device
    /// replays it as one graph, or runs its launches again and why (a device without graphs,
    /// or a recording the device refused). `None` before, and where nothing is recorded.
    fn replays(&self) -> Option<Replay> {
        None
    }
}

/// [`generate`](crate::generate) for many prompts at once: generation `i` of `runs` (a prompt
/// and its options) decodes in stream `i` of `batch` (emptied first), every generation stepped
/// together as a server steps its requests, until all have finished. Returns each one's tokens,
/// without its prompt; each is what `generate` writes for it alone, up to the batch's rounding.
///
/// # Panics
/// With more runs than `batch` has streams.
pub fn generate_batch(
    batch: &mut dyn BatchDecoder,
    runs: &[(Vec<u32>, GenerateOptions)],
) -> Result<Vec<Vec<u32>>, GenerateError> {
    assert!(runs.len() <= batch.streams(), "a stream per generation");
    let (block, vocab) = (batch.block_size(), batch.vocab_size());
    let mut live = Vec::with_capacity(runs.len());
    for (s, (prompt, options)) in runs.iter().enumerate() {
        batch.clear(s);
        live.push((s, Continuation::new(prompt, options, block, vocab)?));
    }
    let mut got = vec![Vec::new(); runs.len()];
    while !live.is_empty() {
        let feeds: Vec<(usize, Vec<u32>)> = live
            .iter_mut()
            .map(|(s, c)| {
                let feed = c.feed(batch.cached(*s));
                if feed.clear {
                    batch.clear(*s);
                }
                (*s, c.tokens()[feed.from..].to_vec())
            })
            .collect();
        let refs: Vec<(usize, &[u32])> = feeds.iter().map(|(s, t)| (*s, &t[..])).collect();
        let logits = batch.step(&refs)?;
        for (row, (_, c)) in live.iter_mut().enumerate() {
            c.accept(&logits[row * vocab..(row + 1) * vocab])?;
        }
        live.retain_mut(|(s, c)| match c.finished() {
            None => true,
            Some(_) => {
                got[*s] = c.sampled().iter().map(|t| t.id).collect();
                false
            }
        });
    }
    Ok(got)
}

/// Refuses a step that cannot run: a stream fed twice or not in the batch (a bug: panics), an
/// empty feed, an id past the vocabulary, a feed that runs past `block_size`.
pub(crate) fn check_feeds(
    feeds: &[(usize, &[u32])],
    cached: impl Fn(usize) -> usize,
    streams: usize,
    vocab: usize,
    block_size: usize,
) -> Result<(), ModelError> {
    let mut seen = vec![false; streams];
    for &(stream, tokens) in feeds {
        assert!(
            stream < seen.len() && !std::mem::replace(&mut seen[stream], true),
            "stream {stream} fed twice in a step, or not a stream of this batch"
        );
        if tokens.is_empty() {
            return Err(AttentionError::EmptySequence.into());
        }
        if let Some(&id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::TokenOutOfRange {
                id: id.into(),
                vocab_size: vocab,
            });
        }
        let len = cached(stream) + tokens.len();
        if len > block_size {
            return Err(AttentionError::SequenceTooLong {
                len,
                max: block_size,
            }
            .into());
        }
    }
    Ok(())
}
