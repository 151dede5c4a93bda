//! Decoding many sequences at once, a server's requests: [`BatchDecoder`], on the fused CPU
//! decoder ([`FusedBatch`]) and on Burn's backends ([`GptBatch`]).
//!
//! Each sequence (a *stream*) has its own KV cache and length. A step feeds some streams their
//! next token and others a piece of a prompt; the single tokens of all streams go through the
//! weights together, one row each, which reads every weight once for all of them (one stream
//! alone is a matrix-vector product that waits on memory). A longer feed goes through the
//! stream's caches as it would alone.

use tinygpt_attention::{AttentionError, KvCache};

use crate::cpu::FusedBatch;
use crate::error::ModelError;
use crate::generate::{Decoder, host_values};
use crate::gpt::Gpt;

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
}

impl BatchDecoder for FusedBatch {
    fn streams(&self) -> usize {
        FusedBatch::streams(self)
    }
    fn block_size(&self) -> usize {
        FusedBatch::block_size(self)
    }
    fn vocab_size(&self) -> usize {
        FusedBatch::vocab_size(self)
    }
    fn cached(&self, stream: usize) -> usize {
        FusedBatch::cached(self, stream)
    }
    fn clear(&mut self, stream: usize) {
        FusedBatch::clear(self, stream)
    }
    fn alone(&mut self) -> &mut dyn Decoder {
        FusedBatch::alone(self)
    }
    fn step(&mut self, feeds: &[(usize, &[u32])]) -> Result<&[f32], ModelError> {
        FusedBatch::step(self, feeds)
    }
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

/// A [`Gpt`] decoding many streams at once with Burn's tensor ops, on its device: a
/// [`KvCache`] per layer per stream (of fixed capacity on a GPU, as [`Gpt::decoder`] keeps
/// them). The single tokens of a step go through [`Gpt::forward_rows`] together; a longer
/// feed (or a step's only single token) through [`Gpt::forward_cached`] on its stream's
/// caches, as alone. The step's logits come
/// to the host, where each request samples its own way.
pub struct GptBatch<'a> {
    gpt: &'a Gpt,
    /// `[stream][layer]`.
    streams: Vec<Vec<KvCache>>,
    single: Box<dyn Decoder + 'a>,
    out: Vec<f32>,
}

impl<'a> GptBatch<'a> {
    /// `gpt` and `streams` empty streams.
    pub fn new(gpt: &'a Gpt, streams: usize) -> Self {
        let on_gpu = tinygpt_attention::flash::is_cube_device(&gpt.wte.weight.device());
        let caches = match on_gpu {
            true => gpt.new_fixed_caches(),
            false => gpt.new_caches(),
        };
        Self {
            gpt,
            streams: vec![caches; streams],
            single: Box::new(gpt.decoder()),
            out: Vec::new(),
        }
    }

    /// The logits `[vocab]` after stream `stream`'s `tokens`, fed through its caches.
    fn feed_one(&mut self, stream: usize, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let logits = self.gpt.next_logits(tokens, &mut self.streams[stream])?;
        Ok(host_values(logits))
    }
}

impl BatchDecoder for GptBatch<'_> {
    fn streams(&self) -> usize {
        self.streams.len()
    }
    fn block_size(&self) -> usize {
        self.gpt.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.gpt.vocab_size()
    }
    fn cached(&self, stream: usize) -> usize {
        self.streams[stream].first().map_or(0, KvCache::len)
    }
    fn clear(&mut self, stream: usize) {
        self.streams[stream].iter_mut().for_each(KvCache::clear);
    }
    fn alone(&mut self) -> &mut dyn Decoder {
        &mut *self.single
    }

    fn step(&mut self, feeds: &[(usize, &[u32])]) -> Result<&[f32], ModelError> {
        let (vocab, block) = (self.vocab_size(), self.block_size());
        check_feeds(feeds, |s| self.cached(s), self.streams(), vocab, block)?;
        self.out.resize(feeds.len() * vocab, 0.0);
        let mut singles: Vec<(usize, usize, u32)> = Vec::new(); // (feed, stream, token)
        // One single token goes the way it goes alone: a row of its own needs no mask.
        let rows = feeds.iter().filter(|(_, t)| t.len() == 1).count();
        for (i, &(stream, tokens)) in feeds.iter().enumerate() {
            match tokens {
                [token] if rows > 1 => singles.push((i, stream, *token)),
                _ => {
                    let logits = self.feed_one(stream, tokens)?;
                    self.out[i * vocab..(i + 1) * vocab].copy_from_slice(&logits);
                }
            }
        }
        if !singles.is_empty() {
            let tokens: Vec<u32> = singles.iter().map(|&(_, _, t)| t).collect();
            let mut caches = rows_of(&mut self.streams, singles.iter().map(|&(_, s, _)| s));
            let logits = host_values(self.gpt.forward_rows(&tokens, &mut caches)?);
            for (r, &(i, _, _)) in singles.iter().enumerate() {
                let row = &logits[r * vocab..(r + 1) * vocab];
                self.out[i * vocab..(i + 1) * vocab].copy_from_slice(row);
            }
        }
        Ok(&self.out)
    }
}

/// The caches of `rows` (distinct streams), in that order.
fn rows_of(streams: &mut [Vec<KvCache>], rows: impl Iterator<Item = usize>) -> Vec<&mut [KvCache]> {
    let mut slots: Vec<Option<&mut [KvCache]>> =
        streams.iter_mut().map(|c| Some(c.as_mut_slice())).collect();
    rows.map(|s| slots[s].take().expect("each stream fed once a step"))
        .collect()
}
