//! One generation in progress, a token at a time: what to feed the model next (the sliding
//! window, the cache rebuilds), and what a row of logits becomes (the sampled token, stop
//! sequences, the tokens safe to stream). [`generate`](crate::generate()) runs one to its end
//! on a [`Decoder`](crate::Decoder); a server that decodes many requests in one batch advances
//! each by a step, and gets the same tokens.

use std::ops::Range;

use super::device_pick::{Pick, Picked};
use super::draw::Sampled;
use super::options::GenerateOptions;
use super::sampler::Sampler;
use crate::error::GenerateError;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It wrote one of its stop sequences (not returned).
    Stop,
    /// It wrote `max_new_tokens` tokens.
    Length,
}

/// What to run the model on for the next token: empty its cache first when `clear`, then feed
/// `tokens()[from..]` (a whole window after a clear, else the one token sampled last).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feed {
    pub clear: bool,
    pub from: usize,
}

/// A generation's state between tokens.
pub struct Continuation {
    options: GenerateOptions,
    sampler: Sampler,
    block_size: usize,
    vocab: usize,
    /// The prompt, then the tokens sampled.
    tokens: Vec<u32>,
    prompt: usize,
    /// Where the window the decoder's cache holds starts in `tokens`.
    window_start: usize,
    generated: Vec<Sampled>,
    /// How many of `generated` were handed out to stream.
    streamed: usize,
    finished: Option<Finish>,
}

impl Continuation {
    /// A generation of `prompt` by a model of `block_size` and `vocab` tokens; its decoder's
    /// cache starts empty.
    pub fn new(
        prompt: &[u32],
        options: &GenerateOptions,
        block_size: usize,
        vocab: usize,
    ) -> Result<Self, GenerateError> {
        options.check(prompt, vocab)?;
        Ok(Self {
            options: options.clone(),
            sampler: Sampler::new(options, vocab),
            block_size,
            vocab,
            tokens: prompt.to_vec(),
            prompt: prompt.len(),
            window_start: 0,
            generated: Vec::new(),
            streamed: 0,
            finished: (options.max_new_tokens == 0).then_some(Finish::Length),
        })
    }

    /// The prompt and the tokens sampled so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether (and why) the generation is over.
    pub fn finished(&self) -> Option<Finish> {
        self.finished
    }

    /// What to feed for the next token, to a decoder whose cache holds `cached` tokens of this
    /// generation's window. The context is the last `block_size` tokens: while it fits, one
    /// token goes through the cache; once the window slides every position shifts, so the
    /// cache is rebuilt from the window (without `options.use_cache`, at every token; with
    /// `options.context_shift`, once per half window).
    pub fn feed(&mut self, cached: usize) -> Feed {
        let start = window(
            self.tokens.len(),
            self.window_start,
            self.block_size,
            &self.options,
        );
        let clear = start != self.window_start || !self.options.use_cache;
        self.window_start = start;
        Feed {
            clear,
            from: start + if clear { 0 } else { cached },
        }
    }

    /// The [`Pick`] for a decoder that picks the next token on its device, when the options
    /// allow it (then [`Self::accept_picked`]); `None`: read the logits ([`Self::accept`]).
    pub fn device_pick(&mut self) -> Option<Pick> {
        self.sampler.device_pick(self.vocab)
    }

    /// Samples the next token from `logits`, the model's output after the fed tokens. Returns
    /// the range of [`Self::sampled`] now safe to stream (tokens that may begin a stop sequence
    /// are held back until they turn out not to).
    pub fn accept(&mut self, logits: &[f32]) -> Result<Range<usize>, GenerateError> {
        // Runs of a fold, not a walk that stops at the first: a vocabulary every token.
        let finite = |run: &[f32]| run.iter().fold(true, |all, l| all & l.is_finite());
        if !logits.chunks(64).all(finite) {
            let position = self.tokens.len() - 1;
            return Err(GenerateError::NonFiniteLogits { position });
        }
        let next = self.sampler.next(logits, &self.tokens[self.window_start..]);
        Ok(self.push(next))
    }

    /// [`Self::accept`], for a token picked on the device.
    pub fn accept_picked(&mut self, picked: Picked) -> Result<Range<usize>, GenerateError> {
        if !picked.finite {
            let position = self.tokens.len() - 1;
            return Err(GenerateError::NonFiniteLogits { position });
        }
        self.sampler.record(picked.id);
        Ok(self.push(picked.sampled()))
    }

    fn push(&mut self, next: Sampled) -> Range<usize> {
        self.tokens.push(next.id);
        self.generated.push(next);
        let new = &self.tokens[self.prompt..];
        let stops = &self.options.stop;
        let ready = if let Some(stop) = stops.iter().find(|s| new.ends_with(s)) {
            self.generated.truncate(self.generated.len() - stop.len());
            self.finished = Some(Finish::Stop);
            self.generated.len()
        } else if self.generated.len() >= self.options.max_new_tokens {
            self.finished = Some(Finish::Length);
            self.generated.len()
        } else {
            new.len() - held_back(&new[self.streamed..], stops)
        };
        let range = self.streamed..ready;
        self.streamed = ready;
        range
    }

    /// The tokens sampled (stop sequences taken out), with their log-probabilities.
    pub fn sampled(&self) -> &[Sampled] {
        &self.generated
    }

    /// Ends the generation where its streaming stopped (a client that went away): the tokens
    /// handed out so far.
    pub fn cancel(mut self) -> Vec<u32> {
        self.generated.truncate(self.streamed);
        self.into_tokens()
    }

    /// The tokens generated, without the prompt or a stop sequence.
    pub fn into_tokens(self) -> Vec<u32> {
        self.generated.iter().map(|t| t.id).collect()
    }
}

/// Where the context of the next step starts in a sequence of `len` tokens whose cached window
/// starts at `current`: the last `block_size` tokens (sliding by one, nanoGPT's rule), or with
/// [`GenerateOptions::context_shift`] the same start until the window is full, then the last
/// half block.
fn window(len: usize, current: usize, block_size: usize, options: &GenerateOptions) -> usize {
    let sliding = len.saturating_sub(block_size);
    if !options.context_shift || !options.use_cache {
        return sliding;
    }
    match len - current > block_size {
        true => len - (block_size / 2).max(1),
        false => current.max(sliding),
    }
}

/// How many trailing tokens of `pending` could still grow into a stop sequence.
pub(crate) fn held_back(pending: &[u32], stops: &[Vec<u32>]) -> usize {
    (1..=pending.len())
        .rev()
        .find(|&n| {
            let tail = &pending[pending.len() - n..];
            stops.iter().any(|s| s.len() > n && s.starts_with(tail))
        })
        .unwrap_or(0)
}
