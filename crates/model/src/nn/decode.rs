//! A [`Gpt`] as a [`Decoder`] (one sequence) and as a [`BatchDecoder`] (a server's streams),
//! with Burn's tensor ops on the model's device.

use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::Tensor;
use tinygpt_attention::{KvCache, StepAt, StepTables};

use super::captured::CapturedStep;
use super::gpt::Gpt;
use super::rows::{FixedRows, PREFILL_TOKENS, padded};
use crate::error::{GenerateError, ModelError};
use crate::gpu::Kernels;
use crate::sample::{
    BatchDecoder, Decoder, GenerateOptions, Pick, Picked, Replay, check_feeds, generate, read_f32,
};

impl Gpt {
    /// [`generate`] from this model, on its device: [`Gpt::decoder`].
    pub fn generate(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, GenerateError> {
        generate(&mut self.decoder(), prompt, options, on_token)
    }

    /// A [`Decoder`] that runs this model with Burn's tensor ops on its device, a [`KvCache`] per
    /// layer. With [`Kernels::Cube`] (a GPU: wgpu, CUDA) the caches have a fixed capacity of
    /// `block_size`, so every token runs the same kernels, and tokens are picked on the device
    /// ([`Decoder::picks_on_device`]).
    ///
    /// On a GPU each new token after the prompt goes through [`Gpt::forward_step`] and the
    /// pick, recorded once and replayed ([`DecodeStep::Captured`]; `TINYGPT_DECODE_STEP=step`
    /// or `=0` chooses another way, to measure one against the other); a longer feed (the
    /// prompt, a window rebuilt past the block) through [`Gpt::forward_cached`] into the same
    /// caches.
    pub fn decoder(&self) -> impl Decoder + '_ {
        self.decoder_with(DecodeStep::from_env())
    }

    /// [`decoder`](Self::decoder) feeding single tokens on a GPU the way `step` says (on a CPU
    /// there is one way).
    pub fn decoder_with(&self, step: DecodeStep) -> impl Decoder + '_ {
        let on_gpu = match self.kernels() {
            Kernels::Cube => true,
            Kernels::Burn => false,
        };
        let caches = match on_gpu {
            true => self.new_fixed_caches(),
            false => self.new_caches(),
        };
        GptDecoder {
            gpt: self,
            caches: Rc::new(RefCell::new(caches)),
            step: on_gpu.then(|| (step, self.step_tables())),
            captured: None,
            on_gpu,
        }
    }
}

/// How a decoder on a GPU feeds its tokens: one new token, and a prompt in chunks through the
/// same step, or both through [`Gpt::forward_cached`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeStep {
    /// [`Gpt::forward_cached`], as longer feeds: the position reaches the kernels as launch
    /// arguments.
    Forward,
    /// [`Gpt::forward_step`]: the same launches at every position, the position in a buffer;
    /// a prompt goes through the same step in fixed chunks of tokens, so its length changes
    /// no launch either.
    Step,
    /// The step and the pick recorded once and replayed for every token: on CUDA one graph
    /// launch per token (shakespeare-char's size on an H100: 769 tokens/s against the step's
    /// 194, docs/perf.md).
    Captured,
}

impl DecodeStep {
    /// `TINYGPT_DECODE_STEP`: `0` is [`Forward`](Self::Forward), `step`
    /// [`Step`](Self::Step), anything else or nothing [`Captured`](Self::Captured).
    pub fn from_env() -> Self {
        match std::env::var("TINYGPT_DECODE_STEP").as_deref() {
            Ok("0") => Self::Forward,
            Ok("step") => Self::Step,
            _ => Self::Captured,
        }
    }
}

/// A [`Gpt`] and its per-layer KV caches (shared with a recorded step, which writes them too).
struct GptDecoder<'a> {
    gpt: &'a Gpt,
    caches: Rc<RefCell<Vec<KvCache>>>,
    /// On a GPU: how single tokens are fed, and the step's tables.
    step: Option<(DecodeStep, StepTables)>,
    captured: Option<CapturedStep<'a>>,
    on_gpu: bool,
}

impl GptDecoder<'_> {
    /// The logits `[vocab]` after `tokens`, fed through the caches.
    fn logits(&mut self, tokens: &[u32]) -> Result<Tensor<1>, ModelError> {
        let past = self.cached();
        let caches = &mut self.caches.borrow_mut();
        match (&self.step, tokens) {
            (Some((DecodeStep::Step | DecodeStep::Captured, tables)), &[token])
                if past < self.gpt.block_size() =>
            {
                let at = StepAt::new(tables, &[past])?;
                let ids = self.gpt.ids(&[token], [1, 1]);
                let logits = self.gpt.forward_step(ids, &at, caches)?;
                Ok(logits.reshape([self.gpt.vocab_size()]))
            }
            // A prompt through the chunk step a server's rows take: every length the same
            // launches, so a new length compiles nothing.
            (Some((DecodeStep::Step | DecodeStep::Captured, tables)), _)
                if !tokens.is_empty() && past + tokens.len() <= self.gpt.block_size() =>
            {
                let new = PREFILL_TOKENS.min(self.gpt.block_size());
                let (mut ids, mut positions) = (vec![0; new], vec![0; new]);
                let mut logits = None;
                for (c, piece) in tokens.chunks(new).enumerate() {
                    padded(piece, past + c * new, &mut ids, &mut positions);
                    let at = StepAt::tokens(tables, &positions, new)?;
                    let ids = self.gpt.ids(&ids, [1, new]);
                    logits = Some(self.gpt.forward_step(ids, &at, caches)?);
                }
                let logits = logits.expect("a prompt of at least one token");
                Ok(logits.reshape([self.gpt.vocab_size()]))
            }
            _ => self.gpt.next_logits(tokens, caches),
        }
    }
}

impl Decoder for GptDecoder<'_> {
    fn block_size(&self) -> usize {
        self.gpt.block_size()
    }

    fn vocab_size(&self) -> usize {
        self.gpt.vocab_size()
    }

    fn cached(&self) -> usize {
        self.caches.borrow().first().map_or(0, KvCache::len)
    }

    fn clear(&mut self) {
        self.caches.borrow_mut().iter_mut().for_each(KvCache::clear);
    }

    /// Ids are not range-checked on the device: [`generate`] checked the prompt, and sampled ids
    /// are in range.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        Ok(read_f32(self.logits(tokens)?))
    }

    fn picks_on_device(&self) -> bool {
        self.on_gpu
    }

    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        let past = self.cached();
        match (&self.step, tokens) {
            (Some((DecodeStep::Captured, tables)), &[token]) if past < self.gpt.block_size() => {
                if !self.captured.as_ref().is_some_and(|c| c.picks_like(pick)) {
                    let (tables, caches) = (tables.clone(), self.caches.clone());
                    let step = CapturedStep::record(self.gpt, tables, caches, token, past, pick)?;
                    self.captured = Some(step);
                }
                let captured = self.captured.as_mut().expect("recorded above");
                Ok(captured.step(token, past, pick, &self.caches))
            }
            _ => Ok(pick.on_device(self.logits(tokens)?)),
        }
    }

    fn replays(&self) -> Option<Replay> {
        self.captured.as_ref().map(|c| c.replays().clone())
    }
}

/// A [`Gpt`] decoding many streams at once with Burn's tensor ops, on its device.
///
/// On a GPU ([`Kernels::Cube`]) every stream is a row of one fixed cache per layer, and a
/// step's single tokens go through one step of all rows whose kernels and buffers never change,
/// recorded once and replayed (`rows.rs`; `TINYGPT_DECODE_STEP=step` runs it launch by launch,
/// `=0` the way below); the step's longer feeds (prompts) go in together through a second fixed
/// step, a chunk of a few dozen tokens a row at a time. On a
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
    /// `[stream][layer]`, a cache each.
    Streams(Vec<Vec<KvCache>>),
    /// Every stream a row of the same caches (boxed: it holds the recorded step).
    Rows(Box<FixedRows<'a>>),
}

impl<'a> GptBatch<'a> {
    /// `gpt` and `streams` empty streams, a GPU's steps fed as `TINYGPT_DECODE_STEP` says
    /// ([`DecodeStep::from_env`]).
    pub fn new(gpt: &'a Gpt, streams: usize) -> Self {
        Self::with_step(gpt, streams, DecodeStep::from_env())
    }

    /// `gpt` and `streams` empty streams, a GPU's steps fed the way `step` says (a CPU's
    /// streams keep caches of their own whatever it says).
    pub fn with_step(gpt: &'a Gpt, streams: usize, step: DecodeStep) -> Self {
        let rows = |record| Layout::Rows(Box::new(FixedRows::new(gpt, streams, record)));
        let layout = match (gpt.kernels(), step) {
            (Kernels::Burn, _) => Layout::Streams(vec![gpt.new_caches(); streams]),
            (Kernels::Cube, DecodeStep::Forward) => {
                Layout::Streams(vec![gpt.new_fixed_caches(); streams])
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
                    let logits = self.gpt.next_logits(tokens, &mut streams[stream])?;
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
                let mut caches = rows_of(streams, singles.iter().map(|&(s, _)| s));
                Ok(read_f32(self.gpt.forward_rows(&tokens, &mut caches)?))
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
            Layout::Streams(streams) => streams[stream].first().map_or(0, KvCache::len),
            Layout::Rows(rows) => rows.cached(stream),
        }
    }
    fn clear(&mut self, stream: usize) {
        match &mut self.layout {
            Layout::Streams(streams) => streams[stream].iter_mut().for_each(KvCache::clear),
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
fn rows_of(streams: &mut [Vec<KvCache>], rows: impl Iterator<Item = usize>) -> Vec<&mut [KvCache]> {
    let mut slots: Vec<Option<&mut [KvCache]>> =
        streams.iter_mut().map(|c| Some(c.as_mut_slice())).collect();
    rows.map(|s| slots[s].take().expect("each stream fed once a step"))
        .collect()
}
