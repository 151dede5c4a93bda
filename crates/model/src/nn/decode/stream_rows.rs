//! A server's streams on a GPU: every stream a row of one fixed cache per layer
//! (`[streams, kv_heads, block_size, d_head]`), and two steps that feed every row at once with
//! the same kernels and buffers every time: one token a row, and a prompt's chunk of
//! [`PREFILL_TOKENS`] a row. On CUDA each is recorded once and replayed (one graph launch a
//! step, [`capture`]); elsewhere it simply runs again.
//!
//! A row with nothing to feed this step (a stalled client, a free slot, a stream decoding while
//! others read their prompts) is not cut out, which would change the shapes: it is fed token 0
//! at its next free position and its output is ignored. What it writes there is no harm: that
//! position is past its length, hidden from it, and the row's next token or piece of prompt
//! writes it again before anyone reads it. (A full row, at `block_size`, writes its last
//! position; a full row is always cleared before it is fed again.)
//!
//! A prompt (or a window rebuilt) goes through the chunk step, [`PREFILL_TOKENS`] tokens at a
//! time; a shorter last chunk repeats its last token at its last position ([`StepAt::tokens`]).
//! Every prompt length runs the same launches, so a new length compiles nothing, and prompts
//! of several streams go in together.

use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::{Int, Tensor, TensorData};
use tinygpt_attention::{KvCache, StepAt, StepTables};

use super::forward::Ids;
use super::graph::{DeviceGraph, capture};
use super::stream_step::{refill, refill_ids};
use crate::error::ModelError;
use crate::nn::gpt::Gpt;
use crate::sample::{Replay, read_f32};

/// Tokens of a prompt each row of the chunk step takes at once (fewer where the context is
/// shorter): a prompt of up to this many goes in one step; a short one costs the whole chunk's
/// arithmetic for every row, which on a GPU should cost less than the launches and compiles it
/// saves (not yet measured on one).
pub(crate) const PREFILL_TOKENS: usize = 32;

/// Every stream a row of the same fixed caches.
pub(crate) struct FixedRows<'a> {
    gpt: &'a Gpt,
    /// Per layer, `[streams, kv_heads, block_size, d_head]` once written.
    caches: Rc<RefCell<Vec<KvCache>>>,
    /// Tokens each stream holds.
    lens: Vec<usize>,
    /// The last token each stream holds (read while it holds any): what its next pairs with in
    /// a bigram table.
    last: Vec<u32>,
    tables: StepTables,
    /// Whether the steps are recorded at their first run and replayed (else run launch by
    /// launch).
    capture: bool,
    /// The step of one token a row, and the chunk step, once captured.
    one_token: Option<CapturedRows<'a>>,
    chunked: Option<CapturedRows<'a>>,
}

impl<'a> FixedRows<'a> {
    /// `streams` empty streams of `gpt`, their steps captured and replayed if `capture`.
    pub(crate) fn new(gpt: &'a Gpt, streams: usize, capture: bool) -> Self {
        Self {
            gpt,
            caches: Rc::new(RefCell::new(gpt.new_fixed_caches())),
            lens: vec![0; streams],
            last: vec![0; streams],
            tables: gpt.step_tables(),
            capture,
            one_token: None,
            chunked: None,
        }
    }

    /// Whether the recorded one-token step replays as one device graph, and if not why;
    /// `None` before it is recorded.
    pub(crate) fn replays(&self) -> Option<Replay> {
        self.one_token.as_ref().map(|r| r.graph.replays().clone())
    }

    pub(crate) fn streams(&self) -> usize {
        self.lens.len()
    }

    pub(crate) fn cached(&self, stream: usize) -> usize {
        self.lens[stream]
    }

    /// Forgets stream `stream`'s tokens (its row is overwritten as new ones come).
    pub(crate) fn clear(&mut self, stream: usize) {
        self.lens[stream] = 0;
    }

    /// The token stream `stream`'s next token follows: none while it holds none.
    fn before(&self, stream: usize) -> Option<u32> {
        (self.lens[stream] > 0).then_some(self.last[stream])
    }

    /// Tokens a row of the chunk step takes.
    fn chunk(&self) -> usize {
        PREFILL_TOKENS.min(self.gpt.block_size())
    }

    /// Each `(stream, tokens)` (distinct streams, checked by the caller) fed through its row,
    /// a chunk of each a step, every other row sitting out: the logits after each feed's last
    /// token, `[feeds * vocab]` in the feeds' order.
    pub(crate) fn prefill(&mut self, feeds: &[(usize, &[u32])]) -> Result<Vec<f32>, ModelError> {
        let (new, vocab, last) = (
            self.chunk(),
            self.gpt.vocab_size(),
            self.gpt.block_size() - 1,
        );
        let mut out = vec![0.0; feeds.len() * vocab];
        let steps = feeds.iter().map(|(_, t)| t.len().div_ceil(new)).max();
        for step in 0..steps.unwrap_or(0) {
            // Sitting out: token 0 at the next free position, `new` times.
            let mut tokens = vec![0u32; self.streams() * new];
            let mut befores = vec![None; self.streams() * new];
            let mut positions: Vec<usize> = (0..self.streams() * new)
                .map(|i| self.lens[i / new].min(last))
                .collect();
            let mut fed = Vec::new();
            for (f, &(stream, feed)) in feeds.iter().enumerate() {
                let piece = feed.chunks(new).nth(step).unwrap_or_default();
                if piece.is_empty() {
                    continue;
                }
                let row = stream * new..(stream + 1) * new;
                padded(
                    piece,
                    self.before(stream),
                    self.lens[stream],
                    &mut tokens[row.clone()],
                    &mut befores[row.clone()],
                    &mut positions[row],
                );
                self.lens[stream] += piece.len();
                self.last[stream] = piece[piece.len() - 1];
                if step + 1 == feed.len().div_ceil(new) {
                    fed.push((f, stream));
                }
            }
            let logits = self.run(&tokens, &befores, &positions, new)?;
            // Read back only where a feed ends: a longer prompt's earlier chunks wait for
            // nothing.
            if fed.is_empty() {
                continue;
            }
            let logits = read_f32(logits);
            for (f, stream) in fed {
                out[f * vocab..(f + 1) * vocab]
                    .copy_from_slice(&logits[stream * vocab..(stream + 1) * vocab]);
            }
        }
        Ok(out)
    }

    /// One token for each `(stream, token)` (distinct streams, each below `block_size`; checked
    /// by the caller), every other row sitting out: the logits of all rows,
    /// `[streams * vocab]`, in one read.
    pub(crate) fn step(&mut self, singles: &[(usize, u32)]) -> Result<Vec<f32>, ModelError> {
        // A fed row's next position is its length (below block_size); a full row sitting
        // out writes its last.
        let last = self.gpt.block_size() - 1;
        let positions: Vec<usize> = self.lens.iter().map(|&l| l.min(last)).collect();
        let mut tokens = vec![0u32; self.streams()];
        let befores: Vec<Option<u32>> = (0..self.streams()).map(|s| self.before(s)).collect();
        for &(stream, token) in singles {
            tokens[stream] = token;
        }
        let logits = self.run(&tokens, &befores, &positions, 1)?;
        for &(stream, token) in singles {
            self.lens[stream] += 1;
            self.last[stream] = token;
        }
        Ok(read_f32(logits))
    }

    /// The step of `new` tokens a row (`tokens` and `positions` `[streams * new]`), recorded
    /// at its first run if recording: the logits of each row's last token `[streams, vocab]`.
    fn run(
        &mut self,
        tokens: &[u32],
        befores: &[Option<u32>],
        positions: &[usize],
        new: usize,
    ) -> Result<Tensor<2>, ModelError> {
        let rows = self.streams();
        if !self.capture {
            let at = StepAt::tokens(&self.tables, positions, new)?;
            let ids = self.gpt.ids(tokens, befores, [rows, new]);
            return self
                .gpt
                .forward_step(ids, &at, &mut self.caches.borrow_mut());
        }
        let slot = match new {
            1 => &mut self.one_token,
            _ => &mut self.chunked,
        };
        if slot.is_none() {
            let (tables, caches) = (self.tables.clone(), self.caches.clone());
            let fed = (tokens, befores, positions);
            let captured = CapturedRows::capture(self.gpt, tables, caches, fed, new)?;
            *slot = Some(captured);
        }
        Ok(slot
            .as_mut()
            .expect("recorded above")
            .step(tokens, befores, positions))
    }
}

/// A chunk of a row's prompt, `piece` (not empty) at positions `len..` after `before` (the
/// row's last token; `None` at its start), as the chunk step takes it: `tokens`, the token
/// before each (`befores`, for a bigram table) and `positions` (`new` each) filled, the last
/// token repeated, after the same token, at its own position past the piece's end.
pub(crate) fn padded(
    piece: &[u32],
    before: Option<u32>,
    len: usize,
    tokens: &mut [u32],
    befores: &mut [Option<u32>],
    positions: &mut [usize],
) {
    let last = piece.len() - 1;
    let rows = tokens.iter_mut().zip(befores).zip(positions);
    for (i, ((token, previous), at)) in rows.enumerate() {
        let i = i.min(last);
        let prior = match i {
            0 => before,
            i => Some(piece[i - 1]),
        };
        (*token, *previous, *at) = (piece[i], prior, len + i);
    }
}

/// The buffers a replay reads.
struct RowInputs {
    /// `[rows, new]`: each row's tokens, and with a bigram table their pairs.
    ids: Ids,
    /// `[rows, new]`: their positions.
    positions: Tensor<2, Int>,
    /// The positions on the host: a backend without graphs runs the step again, which checks
    /// them.
    host: Vec<usize>,
}

/// The rows step, as the closure [`capture`] records.
type Step<'a> = Box<dyn FnMut() -> Tensor<2> + 'a>;

/// The rows step, recorded.
struct CapturedRows<'a> {
    gpt: &'a Gpt,
    graph: DeviceGraph<Tensor<2>, Step<'a>>,
    inputs: Rc<RefCell<RowInputs>>,
}

impl<'a> CapturedRows<'a> {
    /// Records `gpt`'s step of `new` tokens a row over `caches` for `(tokens, befores,
    /// positions)` (`[rows * new]` each). Recording runs the step a few times (warm-up): each
    /// run writes the same rows with the same keys and values.
    fn capture(
        gpt: &'a Gpt,
        tables: StepTables,
        caches: Rc<RefCell<Vec<KvCache>>>,
        (tokens, befores, positions): (&[u32], &[Option<u32>], &[usize]),
        new: usize,
    ) -> Result<Self, ModelError> {
        let device = gpt.wte.weight.device();
        let rows = tokens.len() / new;
        let inputs = Rc::new(RefCell::new(RowInputs {
            ids: gpt.ids(tokens, befores, [rows, new]),
            positions: Tensor::from_data(TensorData::new(as_i64(positions), [rows, new]), &device),
            host: positions.to_vec(),
        }));
        // The step's checks run here, outside the recording, where an error is a value.
        StepAt::tokens(&tables, positions, new)?;
        let read = inputs.clone();
        let step: Step<'a> = Box::new(move || {
            let inputs = read.borrow();
            let at = StepAt::tokens_on_device(&tables, inputs.positions.clone(), &inputs.host)
                .expect("positions checked before the step");
            gpt.forward_step(inputs.ids.clone(), &at, &mut caches.borrow_mut())
                .expect("a step checked before it was recorded")
        });
        Ok(Self {
            gpt,
            graph: capture(&device, step),
            inputs,
        })
    }

    /// The inputs written in place, one replay: the logits `[rows, vocab]`.
    fn step(&mut self, tokens: &[u32], befores: &[Option<u32>], positions: &[usize]) -> Tensor<2> {
        {
            let mut inputs = self.inputs.borrow_mut();
            refill_ids(&mut inputs.ids, self.gpt, tokens, befores);
            refill(&mut inputs.positions, as_i64(positions));
            inputs.host = positions.to_vec();
        }
        // Safety: every buffer the recording touched is alive (the inputs and caches behind
        // their `Rc`s, the model's parameters borrowed for 'a), and the refreshes above and the
        // read after are issued from this thread, on the stream the graph was recorded on.
        unsafe { self.graph.replay() }.clone()
    }
}

fn as_i64(positions: &[usize]) -> Vec<i64> {
    positions.iter().map(|&p| p as i64).collect()
}
