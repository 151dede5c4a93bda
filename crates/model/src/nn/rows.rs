//! A server's streams on a GPU: every stream a row of one fixed cache per layer
//! (`[streams, kv_heads, block_size, d_head]`), and one step that feeds every row a token at
//! once, with the same kernels and buffers every time. On CUDA it is recorded once and
//! replayed (one graph launch a step, [`record`]); elsewhere it simply runs again.
//!
//! A row with nothing to feed this step (a stalled client, a free slot, a prompt going in
//! through its own feed) is not cut out, which would change the shapes: it is fed token 0 at its
//! next free position and its output is ignored. What it writes there is no harm: that
//! position is past its length, hidden from it, and the row's next token or piece of prompt
//! writes it again before anyone reads it. (A full row, at `block_size`, writes its last
//! position; a full row is always cleared before it is fed again.)
//!
//! A longer feed (a prompt, a window rebuilt) takes its row out as a cache of one sequence,
//! goes through [`Gpt::next_logits`] as it would alone, and puts the row back in place
//! ([`KvCache::row`], [`KvCache::set_row`]): the buffers a recording replays stay the same.

use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::{Int, Tensor, TensorData};
use tinygpt_attention::{KvCache, StepAt, StepTables};

use super::captured::refill;
use super::gpt::Gpt;
use super::record::{Recorded, record};
use crate::error::ModelError;
use crate::sample::{Replay, read_f32};

/// Every stream a row of the same fixed caches.
pub(crate) struct FixedRows<'a> {
    gpt: &'a Gpt,
    /// Per layer, `[streams, kv_heads, block_size, d_head]` once written.
    caches: Rc<RefCell<Vec<KvCache>>>,
    /// Tokens each stream holds.
    lens: Vec<usize>,
    tables: StepTables,
    /// Whether the step is recorded at its first run and replayed (else run launch by launch).
    record: bool,
    recorded: Option<RecordedRows<'a>>,
}

impl<'a> FixedRows<'a> {
    /// `streams` empty streams of `gpt`, their step recorded and replayed if `record`.
    pub(crate) fn new(gpt: &'a Gpt, streams: usize, record: bool) -> Self {
        Self {
            gpt,
            caches: Rc::new(RefCell::new(gpt.new_fixed_caches())),
            lens: vec![0; streams],
            tables: gpt.step_tables(),
            record,
            recorded: None,
        }
    }

    /// Whether the recorded step replays as one device graph, and if not why; `None` before it
    /// is recorded.
    pub(crate) fn replays(&self) -> Option<Replay> {
        self.recorded.as_ref().map(|r| r.graph.replays().clone())
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

    /// The logits `[vocab]` after stream `stream`'s `tokens` (checked by the caller), fed
    /// through its row as through a cache of its own.
    pub(crate) fn feed_one(
        &mut self,
        stream: usize,
        tokens: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        let (streams, len) = (self.streams(), self.lens[stream]);
        let mut row: Vec<KvCache> = self
            .caches
            .borrow()
            .iter()
            .map(|c| c.row(stream, len))
            .collect();
        let logits = self.gpt.next_logits(tokens, &mut row)?;
        for (cache, row) in self.caches.borrow_mut().iter_mut().zip(row) {
            cache.set_row(stream, streams, row);
        }
        self.lens[stream] += tokens.len();
        Ok(read_f32(logits))
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
        for &(stream, token) in singles {
            tokens[stream] = token;
        }
        let logits = match self.record {
            false => {
                let at = StepAt::new(&self.tables, &positions)?;
                let ids = self.gpt.ids(&tokens, [tokens.len(), 1]);
                self.gpt
                    .forward_step(ids, &at, &mut self.caches.borrow_mut())?
            }
            true => {
                if self.recorded.is_none() {
                    let (tables, caches) = (self.tables.clone(), self.caches.clone());
                    let recorded =
                        RecordedRows::record(self.gpt, tables, caches, &tokens, &positions)?;
                    self.recorded = Some(recorded);
                }
                let recorded = self.recorded.as_mut().expect("recorded above");
                recorded.step(&tokens, &positions)
            }
        };
        for &(stream, _) in singles {
            self.lens[stream] += 1;
        }
        Ok(read_f32(logits))
    }
}

/// The buffers a replay reads.
struct RowInputs {
    /// `[rows, 1]`: each row's token.
    tokens: Tensor<2, Int>,
    /// `[rows]`: each row's position.
    positions: Tensor<1, Int>,
    /// The positions on the host: a backend without graphs runs the step again, which checks
    /// them.
    host: Vec<usize>,
}

/// The rows step, as the closure [`capture`] records.
type Step<'a> = Box<dyn FnMut() -> Tensor<2> + 'a>;

/// The rows step, recorded.
struct RecordedRows<'a> {
    graph: Recorded<Tensor<2>, Step<'a>>,
    inputs: Rc<RefCell<RowInputs>>,
}

impl<'a> RecordedRows<'a> {
    /// Records `gpt`'s step over `caches` for `tokens` at `positions` (one a row). Recording
    /// runs the step a few times (warm-up): each run writes the same rows with the same keys
    /// and values.
    fn record(
        gpt: &'a Gpt,
        tables: StepTables,
        caches: Rc<RefCell<Vec<KvCache>>>,
        tokens: &[u32],
        positions: &[usize],
    ) -> Result<Self, ModelError> {
        let device = gpt.wte.weight.device();
        let rows = tokens.len();
        let inputs = Rc::new(RefCell::new(RowInputs {
            tokens: gpt.ids(tokens, [rows, 1]),
            positions: Tensor::from_data(TensorData::new(as_i64(positions), [rows]), &device),
            host: positions.to_vec(),
        }));
        // The step's checks run here, outside the recording, where an error is a value.
        StepAt::new(&tables, positions)?;
        let read = inputs.clone();
        let step: Step<'a> = Box::new(move || {
            let inputs = read.borrow();
            let at = StepAt::on_device(&tables, inputs.positions.clone(), &inputs.host)
                .expect("positions checked before the step");
            gpt.forward_step(inputs.tokens.clone(), &at, &mut caches.borrow_mut())
                .expect("a step checked before it was recorded")
        });
        Ok(Self {
            graph: record(&device, step),
            inputs,
        })
    }

    /// The inputs written in place, one replay: the logits `[rows, vocab]`.
    fn step(&mut self, tokens: &[u32], positions: &[usize]) -> Tensor<2> {
        {
            let mut inputs = self.inputs.borrow_mut();
            refill(
                &mut inputs.tokens,
                tokens.iter().map(|&t| t as i64).collect(),
            );
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
