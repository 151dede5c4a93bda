//! A [`Gpt`] decoding, with Burn's tensor ops on the model's device: as a [`Decoder`] (one
//! sequence, here) and as a [`BatchDecoder`] (a server's streams, [`GptBatch`]), and the
//! ways a GPU may do it ([`Decoding`]).
//!
//! - `forward.rs`: the decode forwards of the model and its blocks (a sequence through its
//!   caches, continuous batching's rows, the fixed decode step);
//! - `batch.rs`: [`GptBatch`], many streams at once;
//! - `stream_step.rs`: one stream's decode step and pick, captured as a device graph once and
//!   replayed per token;
//! - `stream_rows.rs`: a server's streams on a GPU as rows of one fixed cache, their steps
//!   captured and replayed;
//! - `graph.rs`: a closure captured as a device graph (Burn's `capture`), saying why when the
//!   device refuses.

mod batch;
mod forward;
mod graph;
mod stream_rows;
mod stream_step;

use std::cell::RefCell;
use std::rc::Rc;

use burn::tensor::Tensor;
use tinygpt_attention::{KvCache, StepAt, StepTables};

use crate::nn::decoding::DecodeStep;
pub use batch::GptBatch;
pub use forward::{Ids, befores};
use stream_rows::{PREFILL_TOKENS, padded};
use stream_step::{CapturedStep, Fed};

use crate::error::{GenerateError, ModelError};
use crate::gpu::Kernels;
use crate::nn::gpt::Gpt;
use crate::sample::{Decoder, GenerateOptions, Pick, Picked, Replay, generate, read_f32};

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
    /// pick, captured once and replayed, unless the model's [`Decoding`] says another
    /// [`DecodeStep`]; a longer feed (the prompt, a window rebuilt past the block) through the
    /// step in chunks, or [`Gpt::forward_cached`], into the same caches.
    pub fn decoder(&self) -> impl Decoder + '_ {
        self.decoder_with(self.decoding().step)
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
            last: None,
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
    /// The last token the caches hold: what the next one pairs with in a bigram table.
    last: Option<u32>,
}

impl GptDecoder<'_> {
    /// The token before the next one fed: the last the caches hold, none when they are empty.
    fn before(&self) -> Option<u32> {
        self.last.filter(|_| self.cached() > 0)
    }

    /// The logits `[vocab]` after `tokens`, fed through the caches.
    fn logits(&mut self, tokens: &[u32]) -> Result<Tensor<1>, ModelError> {
        let logits = self.logits_after(tokens, self.before())?;
        self.last = tokens.last().copied();
        Ok(logits)
    }

    /// [`logits`](Self::logits) of `tokens` fed after `before`.
    fn logits_after(
        &mut self,
        tokens: &[u32],
        before: Option<u32>,
    ) -> Result<Tensor<1>, ModelError> {
        let past = self.cached();
        let caches = &mut self.caches.borrow_mut();
        match (&self.step, tokens) {
            (Some((DecodeStep::Step | DecodeStep::Captured, tables)), &[token])
                if past < self.gpt.block_size() =>
            {
                let at = StepAt::new(tables, &[past])?;
                let ids = self.gpt.ids(&[token], &[before], [1, 1]);
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
                let mut prior = vec![None; new];
                let mut logits = None;
                for (c, piece) in tokens.chunks(new).enumerate() {
                    let first = match c {
                        0 => before,
                        c => Some(tokens[c * new - 1]),
                    };
                    let at = past + c * new;
                    padded(piece, first, at, &mut ids, &mut prior, &mut positions);
                    let at = StepAt::tokens(tables, &positions, new)?;
                    let ids = self.gpt.ids(&ids, &prior, [1, new]);
                    logits = Some(self.gpt.forward_step(ids, &at, caches)?);
                }
                let logits = logits.expect("a prompt of at least one token");
                Ok(logits.reshape([self.gpt.vocab_size()]))
            }
            _ => self.gpt.next_logits(tokens, before, caches),
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
                let fed = Fed {
                    token,
                    before: self.before(),
                    position: past,
                };
                if !self.captured.as_ref().is_some_and(|c| c.picks_like(pick)) {
                    let (tables, caches) = (tables.clone(), self.caches.clone());
                    let step = CapturedStep::capture(self.gpt, tables, caches, fed, pick)?;
                    self.captured = Some(step);
                }
                let captured = self.captured.as_mut().expect("captured above");
                let picked = captured.step(fed, pick, &self.caches);
                self.last = Some(token);
                Ok(picked)
            }
            _ => Ok(pick.on_device(self.logits(tokens)?)),
        }
    }

    fn replays(&self) -> Option<Replay> {
        self.captured.as_ref().map(|c| c.replays().clone())
    }
}
