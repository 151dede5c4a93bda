//! [`FusedBatch`]: the fused CPU decoder for many streams at once, a server's requests. Each
//! stream has its own KV cache and position; a step feeds every stream its next token in one
//! pass over the weights (each weight row read once for all of them, where one stream alone is
//! a matrix-vector product that waits on memory).
//!
//! Each row is computed exactly as [`FusedDecoder`] computes that stream alone (the same sums
//! in the same order: each output one dot product of its weight row, in f32 or int8; row-wise
//! norms; attention over the stream's own cache), and a window (a prompt, a rebuild after the window
//! slid) goes through `FusedDecoder` itself: a stream's logits, and so its tokens, do not depend
//! on what else is in the batch. The tests check equality bit for bit.

use super::attend::attend;
use super::cache::StreamCache;
use super::decoder::{FusedDecoder, HeadRows};
use super::plan::Matrices;
use super::quant::WeightFormat;
use crate::cpu::block::{self, BlockActs, Ctx, Heads};
use crate::cpu::dims::Dims;
use crate::cpu::error::FusedError;
use crate::error::ModelError;
use crate::nn::Gpt;
use crate::sample::{BatchDecoder, Decoder, check_feeds};

/// A [`Gpt`]'s weights on the host and `streams` KV caches.
#[derive(Debug)]
pub struct FusedBatch {
    /// Runs windows, one stream at a time (its cache swapped in), and holds the weights.
    single: FusedDecoder,
    streams: Vec<StreamCache>,
    rows: Rows,
    /// The step's logits, `[feeds, vocab]` in the feeds' order (kept: a step allocates nothing).
    out: Vec<f32>,
}

/// One step's single-token rows: which stream each is, its position, and the activations.
#[derive(Debug, Default)]
struct Rows {
    stream: Vec<usize>,
    position: Vec<usize>,
    x: Vec<f32>,
    next: Vec<f32>,
    acts: BlockActs,
    scores: Vec<f32>,
    head: HeadRows,
}

impl FusedBatch {
    /// `gpt`'s weights and `streams` empty caches (each `2 · n_layer · block_size · kv_width`
    /// floats).
    pub fn new(gpt: &Gpt, streams: usize) -> Result<Self, FusedError> {
        Self::with_weights(gpt, streams, WeightFormat::F32)
    }

    /// [`FusedBatch::new`], the matrices kept in `format` (as [`FusedDecoder::with_weights`]).
    pub fn with_weights(
        gpt: &Gpt,
        streams: usize,
        matrices: impl Into<Matrices>,
    ) -> Result<Self, FusedError> {
        Ok(Self::sharing(
            &FusedDecoder::with_weights(gpt, matrices)?,
            streams,
        ))
    }

    /// `streams` empty streams on `decoder`'s weights, without copying them
    /// ([`FusedDecoder::share`]): the workers of a server hold one copy of the weights.
    pub fn sharing(decoder: &FusedDecoder, streams: usize) -> Self {
        let single = decoder.share();
        Self {
            streams: (0..streams).map(|_| single.empty_cache()).collect(),
            single,
            rows: Rows::default(),
            out: Vec::new(),
        }
    }

    /// How many streams it holds.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// The longest context, in tokens.
    pub fn block_size(&self) -> usize {
        self.dims().block_size
    }

    /// Token ids run from 0 to `vocab_size - 1`.
    pub fn vocab_size(&self) -> usize {
        self.dims().vocab
    }

    /// How many tokens stream `stream`'s cache holds.
    pub fn cached(&self, stream: usize) -> usize {
        self.streams[stream].len
    }

    /// Empties stream `stream`'s cache.
    pub fn clear(&mut self, stream: usize) {
        self.streams[stream].len = 0;
    }

    /// A decoder of the same weights outside the streams, for work of one sequence (scoring a
    /// prompt); what it feeds leaves the streams' caches alone.
    pub fn alone(&mut self) -> &mut FusedDecoder {
        &mut self.single
    }

    fn dims(&self) -> &Dims {
        self.single.dims()
    }

    /// Feeds each `(stream, tokens)` (a stream at most once) at the positions after its cached
    /// ones, and returns the logits of the token after each feed's last, `[feeds, vocab_size]`
    /// in the feeds' order. Single tokens of all streams go through the weights together.
    pub fn step(&mut self, feeds: &[(usize, &[u32])]) -> Result<&[f32], ModelError> {
        self.check(feeds)?;
        let vocab = self.vocab_size();
        self.rows.stream.clear();
        self.rows.position.clear();
        self.out.resize(feeds.len() * vocab, 0.0);
        let out = &mut self.out;
        let mut single_rows = Vec::new();
        for (i, &(stream, tokens)) in feeds.iter().enumerate() {
            if tokens.len() > 1 {
                let cache = &mut self.streams[stream];
                self.single.swap_cache(cache);
                let logits = self.single.feed_checked(tokens);
                out[i * vocab..(i + 1) * vocab].copy_from_slice(logits);
                self.single.swap_cache(cache);
            } else {
                self.rows.stream.push(stream);
                self.rows.position.push(self.streams[stream].len);
                single_rows.push((i, tokens[0]));
            }
        }
        if !single_rows.is_empty() {
            let tokens: Vec<u32> = single_rows.iter().map(|&(_, t)| t).collect();
            self.forward_rows(&tokens);
            for (r, &(i, _)) in single_rows.iter().enumerate() {
                let logits = &self.rows.head.logits[r * vocab..(r + 1) * vocab];
                self.out[i * vocab..(i + 1) * vocab].copy_from_slice(logits);
            }
        }
        Ok(&self.out)
    }

    fn check(&self, feeds: &[(usize, &[u32])]) -> Result<(), ModelError> {
        let d = self.dims();
        let streams = self.streams.len();
        check_feeds(
            feeds,
            |s| self.streams[s].len,
            streams,
            d.vocab,
            d.block_size,
        )
    }

    /// The forward pass of one token of each stream in `rows.stream` (at `rows.position`),
    /// appending their keys and values to the streams' caches; leaves their logits in
    /// `rows.head.logits` `[rows, vocab]`.
    fn forward_rows(&mut self, tokens: &[u32]) {
        let (d, w, matrices, rope) = self.single.parts();
        let (c, n) = (d.width, tokens.len());
        let r = &mut self.rows;
        r.x.resize(n * c, 0.0);
        r.next.resize(n * c, 0.0);
        r.acts.resize(n, d, 0, false);
        r.scores.resize(d.block_size, 0.0);
        let rows = r.x.chunks_exact_mut(c).zip(tokens).zip(&r.position);
        for (((x, &tok), &pos), &s) in rows.zip(&r.stream) {
            let pair = d.pair(self.streams[s].before(&[tok], pos, pos), tok as usize);
            w.embed(x, (tok as usize, pos, pair), matrices.lookup());
        }
        for (l, p) in w.blocks.iter().enumerate() {
            let ctx = Ctx {
                dims: d,
                rope,
                first: 0,
                period: 1,
                streams: Some(&r.position),
                matrices: Some(&matrices.blocks[l]),
                rows_alone: true,
                integer: false,
                helpers: None,
            };
            let (streams, scores) = (&mut self.streams, &mut r.scores);
            let (which, position) = (&r.stream, &r.position);
            block::forward(p, &mut r.acts, &r.x, &mut r.next, ctx, |h| {
                attend_streams(h, d, l, which, position, streams, scores)
            });
            std::mem::swap(&mut r.x, &mut r.next);
        }
        for (&s, &tok) in r.stream.iter().zip(tokens) {
            self.streams[s].len += 1;
            self.streams[s].last = tok;
        }
        // The final norm and the LM head, row by row as `FusedDecoder` does its last row.
        r.head
            .forward(d, w, matrices.head.as_ref(), &r.x, true, None);
    }
}

/// Each row attends to its own stream's cached keys and values up to and including its own,
/// appended first at the stream's position.
fn attend_streams(
    h: Heads<'_>,
    d: &Dims,
    layer: usize,
    which: &[usize],
    position: &[usize],
    streams: &mut [StreamCache],
    scores: &mut [f32],
) {
    let (c, kv, qkv_width) = (d.width, d.kv_width(), d.qkv_width());
    let rows = h.y.chunks_exact_mut(c).zip(h.qkv.chunks_exact(qkv_width));
    for (r, (y, qkv)) in rows.enumerate() {
        let (s, pos) = (&mut streams[which[r]], position[r]);
        let (keys, values) = (&mut s.keys[layer], &mut s.values[layer]);
        keys[pos * kv..(pos + 1) * kv].copy_from_slice(&qkv[c..c + kv]);
        values[pos * kv..(pos + 1) * kv].copy_from_slice(&qkv[c + kv..]);
        let visible = pos + 1;
        attend(
            y,
            &qkv[..c],
            &keys[..visible * kv],
            &values[..visible * kv],
            &mut scores[..visible],
            d.kv_heads,
        );
    }
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
