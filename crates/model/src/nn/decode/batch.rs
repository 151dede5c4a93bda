//! [`GptBatch`]: a [`Gpt`] decoding many streams at once (a server's), with Burn's tensor ops
//! on its device.

use tinygpt_attention::KvCache;

use super::stream_rows::FixedRows;
use crate::error::ModelError;
use crate::gpu::Kernels;
use crate::nn::decoding::DecodeStep;
use crate::nn::gpt::Gpt;
use crate::sample::{BatchDecoder, Decoder, Replay, check_feeds, read_f32};

/// A [`Gpt`] decoding many streams at once with Burn's tensor ops, on its device.
///
/// On a GPU ([`Kernels::Cube`]) every stream is a row of one fixed cache per layer, and a
/// step's single tokens go through one step of all rows whose kernels and buffers never change,
/// captured once and replayed (`stream_rows.rs`; [`DecodeStep::Step`] runs it launch by
/// launch, [`DecodeStep::Forward`] the way below); the step's longer feeds (prompts) go in
/// together through a second fixed step, a chunk of a few dozen tokens a row at a time. On a
/// CPU each stream has its [`KvCache`] per layer; the single tokens of a step go through
/// [`Gpt::forward_rows`] together, a longer feed (or a step's only single token) through
/// [`Gpt::forward_cached`] on its stream's caches, as alone. The step's logits come to the host
/// in one read, where each request samples its own way.
pub struct GptBatch<'a> {
    gpt: &'a Gpt,
    layout: Layout<'a>,
    single: Box<dyn Decoder + 'a>,
    out: Vec<f32>,
}

/// Where a batch keeps its streams' keys and values.
enum Layout<'a> {
    /// A cache each per layer, and the last token each holds.
    Streams(Vec<Stream>),
    /// Every stream a row of the same caches (boxed: it holds the captured step).
    Rows(Box<FixedRows<'a>>),
}

/// One stream of [`Layout::Streams`]: its caches (one per layer) and the last token they hold.
#[derive(Clone)]
struct Stream {
    caches: Vec<KvCache>,
    last: u32,
}

impl Stream {
    fn new(caches: Vec<KvCache>) -> Self {
        Self { caches, last: 0 }
    }

    fn cached(&self) -> usize {
        self.caches.first().map_or(0, KvCache::len)
    }

    /// The token the next one fed follows (a bigram table's pair): none on empty caches.
    fn before(&self) -> Option<u32> {
        (self.cached() > 0).then_some(self.last)
    }
}

impl<'a> GptBatch<'a> {
    /// `gpt` and `streams` empty streams, a GPU's steps fed as the model's
    /// [`Decoding`](crate::Decoding) says.
    pub fn new(gpt: &'a Gpt, streams: usize) -> Self {
        Self::with_step(gpt, streams, gpt.decoding().step)
    }

    /// `gpt` and `streams` empty streams, a GPU's steps fed the way `step` says (a CPU's
    /// streams keep caches of their own whatever it says).
    pub fn with_step(gpt: &'a Gpt, streams: usize, step: DecodeStep) -> Self {
        let rows = |capture| Layout::Rows(Box::new(FixedRows::new(gpt, streams, capture)));
        let layout = match (gpt.kernels(), step) {
            (Kernels::Burn, _) => Layout::Streams(vec![Stream::new(gpt.new_caches()); streams]),
            (Kernels::Cube, DecodeStep::Forward) => {
                Layout::Streams(vec![Stream::new(gpt.new_fixed_caches()); streams])
            }
            (Kernels::Cube, DecodeStep::Step) => rows(false),
            (Kernels::Cube, DecodeStep::Captured) => rows(true),
        };
        Self {
            gpt,
            layout,
            single: Box::new(gpt.decoder()),
            out: Vec::new(),
        }
    }

    /// The logits `[feeds * vocab]` after each `(stream, tokens)`, in that order, each fed
    /// through its stream's caches: one by one, or on a GPU's rows all at once.
    fn feed_longer(&mut self, feeds: &[(usize, &[u32])]) -> Result<Vec<f32>, ModelError> {
        match &mut self.layout {
            Layout::Streams(streams) => {
                let mut out = Vec::with_capacity(feeds.len() * self.gpt.vocab_size());
                for &(stream, tokens) in feeds {
                    let stream = &mut streams[stream];
                    let before = stream.before();
                    let logits = self.gpt.next_logits(tokens, before, &mut stream.caches)?;
                    stream.last = *tokens.last().expect("a feed of at least one token");
                    out.extend(read_f32(logits));
                }
                Ok(out)
            }
            Layout::Rows(rows) => rows.prefill(feeds),
        }
    }

    /// The logits `[singles * vocab]` after each `(stream, token)`, in that order.
    fn feed_singles(&mut self, singles: &[(usize, u32)]) -> Result<Vec<f32>, ModelError> {
        match &mut self.layout {
            Layout::Streams(streams) => {
                let tokens: Vec<u32> = singles.iter().map(|&(_, t)| t).collect();
                let before: Vec<Option<u32>> =
                    singles.iter().map(|&(s, _)| streams[s].before()).collect();
                let mut caches = rows_of(streams, singles.iter().map(|&(s, _)| s));
                let logits = self.gpt.forward_rows(&tokens, &before, &mut caches)?;
                for &(s, token) in singles {
                    streams[s].last = token;
                }
                Ok(read_f32(logits))
            }
            Layout::Rows(rows) => {
                let all = rows.step(singles)?;
                let vocab = self.gpt.vocab_size();
                let row = |s: usize| &all[s * vocab..(s + 1) * vocab];
                Ok(singles.iter().flat_map(|&(s, _)| row(s)).copied().collect())
            }
        }
    }
}

impl BatchDecoder for GptBatch<'_> {
    fn streams(&self) -> usize {
        match &self.layout {
            Layout::Streams(streams) => streams.len(),
            Layout::Rows(rows) => rows.streams(),
        }
    }
    fn block_size(&self) -> usize {
        self.gpt.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.gpt.vocab_size()
    }
    fn cached(&self, stream: usize) -> usize {
        match &self.layout {
            Layout::Streams(streams) => streams[stream].cached(),
            Layout::Rows(rows) => rows.cached(stream),
        }
    }
    fn clear(&mut self, stream: usize) {
        match &mut self.layout {
            Layout::Streams(streams) => streams[stream].caches.iter_mut().for_each(KvCache::clear),
            Layout::Rows(rows) => rows.clear(stream),
        }
    }
    fn alone(&mut self) -> &mut dyn Decoder {
        &mut *self.single
    }
    fn replays(&self) -> Option<Replay> {
        match &self.layout {
            Layout::Streams(_) => None,
            Layout::Rows(rows) => rows.replays(),
        }
    }

    fn step(&mut self, feeds: &[(usize, &[u32])]) -> Result<&[f32], ModelError> {
        let (vocab, block) = (self.vocab_size(), self.block_size());
        check_feeds(feeds, |s| self.cached(s), self.streams(), vocab, block)?;
        self.out.resize(feeds.len() * vocab, 0.0);
        // On a CPU one single token goes the way it goes alone: a row of its own needs no
        // mask. The rows of a GPU's step run whether fed or not.
        let rows = feeds.iter().filter(|(_, t)| t.len() == 1).count();
        let together = matches!(self.layout, Layout::Rows(_)) || rows > 1;
        let (singles, longer): (Vec<usize>, Vec<usize>) =
            (0..feeds.len()).partition(|&i| together && feeds[i].1.len() == 1);
        if !longer.is_empty() {
            let fed: Vec<(usize, &[u32])> = longer.iter().map(|&i| feeds[i]).collect();
            let logits = self.feed_longer(&fed)?;
            place(&mut self.out, vocab, &longer, &logits);
        }
        if !singles.is_empty() {
            let fed: Vec<(usize, u32)> = singles
                .iter()
                .map(|&i| (feeds[i].0, feeds[i].1[0]))
                .collect();
            let logits = self.feed_singles(&fed)?;
            place(&mut self.out, vocab, &singles, &logits);
        }
        Ok(&self.out)
    }
}

/// Row `r` of `logits` (`[order.len(), vocab]`) into row `order[r]` of `out`.
fn place(out: &mut [f32], vocab: usize, order: &[usize], logits: &[f32]) {
    for (row, &i) in logits.chunks_exact(vocab).zip(order) {
        out[i * vocab..(i + 1) * vocab].copy_from_slice(row);
    }
}

/// The caches of `rows` (distinct streams), in that order.
fn rows_of(streams: &mut [Stream], rows: impl Iterator<Item = usize>) -> Vec<&mut [KvCache]> {
    let mut slots: Vec<Option<&mut [KvCache]>> = streams
        .iter_mut()
        .map(|s| Some(s.caches.as_mut_slice()))
        .collect();
    rows.map(|s| slots[s].take().expect("each stream fed once a step"))
        .collect()
}
