//! Continuous batching: a worker decodes every request it holds in one batch
//! ([`BatchDecoder`]: the fused CPU decoder's, or Burn's on the model's device), a row each,
//! one token per row a step. A request joins at the next step (its prompt fed beside the
//! others' tokens) and leaves when it ends; each
//! keeps its own sampler, seed, penalties, stop sequences and window ([`Continuation`]), and its
//! tokens are those it gets alone. A step reads at most [`PREFILL_CHUNK`] tokens of prompts
//! (and windows rebuilt) beyond its first, a longer prompt a chunk a step (the fused decoder
//! alone reads it in the same chunks, so its tokens stay the same): new requests, one after
//! another in the order they came, join without holding every running stream's next token for
//! all of their prompts.
//!
//! Clients are decoupled from decoding: a request's events go to its own bounded channel with
//! `try_send`, never waiting; what the channel cannot take waits in the request's outbox, and
//! a request whose client is not reading sits out the steps until it does (or until the
//! connection's write timeout cuts it off and its channel closes). Nobody else waits for it.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Mutex, PoisonError, TryLockError};
use std::time::Instant;

use std::ops::Range;

use tinygpt_model::gpu::Kernels;
use tinygpt_model::{
    BatchDecoder, Continuation, Finish, FusedBatch, GenerateOptions, decoding::PREFILL_CHUNK,
    decoding::Replay,
};
use tokio::sync::mpsc::{self, error::TrySendError};

use super::generation::{self, Event, Generation, TokenLogprob};
use super::job::{Decoding, Job, Model};
use super::stats::Stats;
use crate::backend::EngineKind;
use crate::data::tokenizer::{TextStream, Tokenizer};
use crate::decoder::{batch_decoder, unpadded};

/// The receiving end of the job queue, which the workers share, and how many requests each
/// worker holds.
pub(super) struct Jobs {
    receiver: Mutex<Receiver<Job>>,
    held: Vec<AtomicUsize>,
    /// Requests a worker decodes at once.
    max_batch: usize,
}

impl Jobs {
    pub(super) fn new(receiver: Receiver<Job>, workers: usize, max_batch: usize) -> Self {
        Self {
            receiver: Mutex::new(receiver),
            held: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            max_batch,
        }
    }

    /// The next job for `worker`, which holds `held` requests: waited for when it holds none;
    /// else one queued now, and only when no other worker holds fewer (an idle one waits on the
    /// queue): the requests spread over the workers, and so over the cores.
    fn take(&self, worker: usize, held: usize) -> Taken {
        self.held[worker].store(held, Ordering::SeqCst);
        let got = match held {
            0 => self
                .receiver
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .recv()
                .map_err(|_| TryRecvError::Disconnected),
            _ if self.held.iter().any(|h| h.load(Ordering::SeqCst) < held) => {
                Err(TryRecvError::Empty)
            }
            _ => match self.receiver.try_lock() {
                Ok(queue) => queue.try_recv(),
                Err(TryLockError::Poisoned(p)) => p.into_inner().try_recv(),
                Err(TryLockError::WouldBlock) => Err(TryRecvError::Empty),
            },
        };
        match got {
            Ok(job) => Taken::Job(job),
            Err(TryRecvError::Empty) => Taken::Nothing,
            Err(TryRecvError::Disconnected) => Taken::Closed,
        }
    }
}

/// Worker `worker`: a batch of `max_batch` streams, and requests taken from `jobs` while it has
/// room.
pub(super) fn work(model: &Model, engine: EngineKind, jobs: &Jobs, worker: usize, stats: &Stats) {
    let max_batch = jobs.max_batch;
    // On a GPU the step of all rows is recorded as a graph, which reads only buffers of this
    // thread's stream: the worker decodes on weights of its own (`Gpt::copied_here`).
    let own;
    let batch = match &model.decoding {
        Decoding::Fused(weights) => Ok(Box::new(FusedBatch::sharing(weights, max_batch)) as Box<_>),
        Decoding::Burn(gpt) => {
            let gpt = match gpt.kernels() {
                Kernels::Cube => {
                    own = gpt.copied_here();
                    &own
                }
                Kernels::Burn => gpt,
            };
            batch_decoder(engine, gpt, max_batch, &model.weights)
        }
    };
    let Ok(mut batch) = batch else {
        return; // `Pool::start` built one already: this does not happen.
    };
    let batch = &mut *batch;
    let mut live: Vec<Live<'_>> = Vec::new();
    let mut free: Vec<usize> = (0..max_batch).rev().collect();
    let mut told = false;
    loop {
        while let Some(&stream) = free.last() {
            match jobs.take(worker, live.len()) {
                Taken::Job(Job::Complete { generation, events }) => {
                    stats.queued.fetch_sub(1, Ordering::SeqCst);
                    stats.active.fetch_add(1, Ordering::SeqCst);
                    free.pop();
                    live.push(Live::new(generation, events, stream));
                }
                Taken::Job(attention @ Job::Attention { .. }) => {
                    stats.queued.fetch_sub(1, Ordering::SeqCst);
                    super::job::run_attention(model, attention);
                }
                Taken::Nothing => break,
                Taken::Closed if live.is_empty() => return,
                Taken::Closed => break,
            }
        }
        let stepped = std::panic::catch_unwind(AssertUnwindSafe(|| {
            step(batch, &mut live, &model.tokenizer, stats)
        }));
        // Said once, when the step is recorded (it replays the same way from then on).
        if !told && let Some(replay) = batch.replays() {
            told = true;
            eprintln!("serve: {}", replay_note(&replay, max_batch));
        }
        if stepped.is_err() {
            // A bug in tinygpt: the requests in the batch fail, the batch starts over empty.
            eprintln!("serve: internal error during generation (a bug in tinygpt)");
            for l in &mut live {
                l.fail("internal error during generation".into(), stats);
            }
            (0..batch.streams()).for_each(|s| batch.clear(s));
        }
        live.retain_mut(|l| match l.over() {
            false => true,
            true => {
                l.report(stats);
                free.push(l.stream);
                stats.active.fetch_sub(1, Ordering::SeqCst);
                false
            }
        });
    }
}

enum Taken {
    Job(Job),
    Nothing,
    Closed,
}

/// One request in the batch.
struct Live<'t> {
    job: Generation,
    events: mpsc::Sender<Event>,
    stream: usize,
    /// The next choice to start, and the one running.
    next: usize,
    running: Option<Choice<'t>>,
    /// Events the client's channel has not taken yet.
    outbox: VecDeque<Event>,
    started: Instant,
    generated: usize,
    end: Option<End>,
    /// Steps in a row its prompt (or window) waited for others' to be read.
    passed_over: u32,
}

/// How a request ended.
#[derive(Clone, Copy, PartialEq)]
enum End {
    Done,
    Gone,
    Failed,
}

/// The choice a request is decoding.
struct Choice<'t> {
    index: usize,
    /// Whether its first feed went in (on a cache emptied for it).
    started: bool,
    /// What is left of a feed longer than a chunk (a prompt, a window), read before the next
    /// token is sampled.
    feeding: Option<Range<usize>>,
    continuation: Continuation,
    text: TextStream<'t>,
    pending: Vec<TokenLogprob>,
}

impl<'t> Live<'t> {
    fn new(job: Generation, events: mpsc::Sender<Event>, stream: usize) -> Self {
        Self {
            job,
            events,
            stream,
            next: 0,
            running: None,
            outbox: VecDeque::new(),
            started: Instant::now(),
            generated: 0,
            end: None,
            passed_over: 0,
        }
    }

    /// Hands the outbox to the client's channel as far as it takes it; false while it is full.
    fn flush(&mut self) -> bool {
        while let Some(event) = self.outbox.pop_front() {
            match self.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.outbox.push_front(event);
                    return false;
                }
                Err(TrySendError::Closed(_)) => {
                    self.end = Some(End::Gone);
                    self.outbox.clear();
                    return false;
                }
            }
        }
        true
    }

    /// Ended, and everything said: the request can leave the batch (dropping its channel ends
    /// the response).
    fn over(&mut self) -> bool {
        let flushed = self.flush();
        matches!(self.end, Some(End::Gone)) || (self.end.is_some() && flushed)
    }

    fn fail(&mut self, message: String, stats: &Stats) {
        stats.failed.fetch_add(1, Ordering::SeqCst);
        self.outbox.push_back(Event::Failed(message));
        self.end = Some(End::Failed);
        self.running = None;
    }

    /// The running choice, starting the next one (its echo first) when none runs; `None` when
    /// the request has no more choices.
    fn choice(
        &mut self,
        batch: &mut dyn BatchDecoder,
        tokenizer: &'t Tokenizer,
        stats: &Stats,
    ) -> Option<&mut Choice<'t>> {
        let tokens = tokenizer.vocab_size().min(batch.vocab_size());
        while self.running.is_none() && self.end.is_none() {
            let Some(spec) = self.job.choices.get(self.next) else {
                self.end = Some(End::Done);
                return None;
            };
            let index = self.next;
            self.next += 1;
            if self.job.echo {
                let mut alone = unpadded(Box::new(batch.alone()), tokens);
                match generation::echo(&mut *alone, tokenizer, &self.job, index, &spec.prompt) {
                    Ok(piece) => self.outbox.push_back(piece),
                    Err(message) => {
                        self.fail(message, stats);
                        return None;
                    }
                }
            }
            let options = GenerateOptions {
                seed: spec.seed,
                ..self.job.options.clone()
            };
            match Continuation::new(&spec.prompt, &options, batch.block_size(), tokens) {
                Ok(c) if c.finished().is_some() => self.outbox.push_back(finished(index, 0, &c)),
                Ok(continuation) => {
                    self.running = Some(Choice {
                        index,
                        started: false,
                        feeding: None,
                        continuation,
                        text: TextStream::after(tokenizer, &spec.prompt),
                        pending: Vec::new(),
                    })
                }
                Err(e) => self.fail(e.to_string(), stats),
            }
        }
        self.running.as_mut()
    }

    /// The tokens this request feeds this step, if it goes on: its next token, or the next
    /// chunk of its prompt (or window) while `read`, the prompt tokens the step reads so far,
    /// leaves room for it within a chunk (the first such feed always goes).
    fn next_feed(
        &mut self,
        batch: &mut dyn BatchDecoder,
        tokenizer: &'t Tokenizer,
        stats: &Stats,
        read: &mut usize,
    ) -> Option<Range<usize>> {
        if self.events.is_closed() {
            self.end = Some(End::Gone);
            return None;
        }
        if !self.flush() {
            stats.client_stalls.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        if self.end.is_some() {
            return None;
        }
        let stream = self.stream;
        let choice = self.choice(batch, tokenizer, stats)?;
        // A choice starts from an empty cache (the stream held someone else's).
        if !choice.started {
            batch.clear(stream);
            choice.started = true;
        }
        let under_way = choice.feeding.is_some();
        let rest = match choice.feeding.take() {
            Some(rest) => rest,
            None => {
                let feed = choice.continuation.feed(batch.cached(stream));
                if feed.clear {
                    batch.clear(stream);
                }
                feed.from..choice.continuation.tokens().len()
            }
        };
        let len = rest.len().min(PREFILL_CHUNK);
        if len > 1 && *read > 0 && *read + len > PREFILL_CHUNK {
            // A prompt under way waits as it is; one not begun is asked for again (the same
            // feed: the cache stays as this leaves it).
            choice.feeding = under_way.then_some(rest);
            self.passed_over += 1;
            return None;
        }
        let end = rest.start + len;
        choice.feeding = (end < rest.end).then_some(end..rest.end);
        *read += if len > 1 { len } else { 0 };
        self.passed_over = 0;
        Some(rest.start..end)
    }

    /// The running choice's tokens `range`: what it feeds this step.
    fn tokens_in(&self, range: Range<usize>) -> &[u32] {
        self.running
            .as_ref()
            .map_or(&[], |choice| &choice.continuation.tokens()[range])
    }

    /// Takes the logits after this request's feed: the sampled token becomes events; an ended
    /// choice its finish. Logits after part of a feed are not a next token's.
    fn accept(&mut self, logits: &[f32], tokenizer: &Tokenizer, stats: &Stats) {
        let logprobs = self.job.logprobs;
        let Some(choice) = self.running.as_mut().filter(|c| c.feeding.is_none()) else {
            return;
        };
        let ready = match choice.continuation.accept(logits) {
            Ok(ready) => ready,
            Err(e) => return self.fail(e.to_string(), stats),
        };
        for token in &choice.continuation.sampled()[ready] {
            stats.tokens.fetch_add(1, Ordering::Relaxed);
            self.generated += 1;
            if logprobs {
                choice.pending.push(generation::described(tokenizer, token));
            }
            if let Some(text) = choice.text.push(token.id) {
                let tokens = std::mem::take(&mut choice.pending);
                let index = choice.index;
                self.outbox.push_back(Event::Piece {
                    index,
                    text,
                    tokens,
                });
            }
        }
        if choice.continuation.finished().is_none() {
            return;
        }
        let rest = choice.text.finish();
        if rest.is_some() || !choice.pending.is_empty() {
            self.outbox.push_back(Event::Piece {
                index: choice.index,
                text: rest.unwrap_or_default(),
                tokens: std::mem::take(&mut choice.pending),
            });
        }
        let done = finished(
            choice.index,
            choice.continuation.sampled().len(),
            &choice.continuation,
        );
        self.outbox.push_back(done);
        self.running = None;
    }

    /// The log line and counters of a request that left.
    fn report(&self, stats: &Stats) {
        let seconds = self.started.elapsed().as_secs_f64();
        match self.end {
            Some(End::Gone) => {
                stats.cancelled.fetch_add(1, Ordering::SeqCst);
                eprintln!(
                    "serve: cancelled after {} tokens in {seconds:.2} s (the client went away or stopped reading)",
                    self.generated
                );
            }
            Some(End::Done) => {
                stats.completed.fetch_add(1, Ordering::SeqCst);
                let prompts: usize = self.job.choices.iter().map(|c| c.prompt.len()).sum();
                let n = self.job.choices.len();
                eprintln!(
                    "serve: {prompts} prompt + {} tokens in {seconds:.2} s ({n} choice{})",
                    self.generated,
                    if n == 1 { "" } else { "s" }
                );
            }
            Some(End::Failed) | None => {}
        }
    }
}

/// Choice `index`'s [`Event::Finished`], `tokens` long.
fn finished(index: usize, tokens: usize, continuation: &Continuation) -> Event {
    Event::Finished {
        index,
        completion_tokens: tokens,
        reason: match continuation.finished() {
            Some(Finish::Stop) => "stop",
            _ => "length",
        },
    }
}

/// One step: every request that can go on (its client keeping up) is fed its next token, or
/// its prompt, in one batch; each row's logits go back to its request.
fn step<'t>(
    batch: &mut dyn BatchDecoder,
    live: &mut [Live<'t>],
    tokenizer: &'t Tokenizer,
    stats: &Stats,
) {
    let begun = Instant::now();
    // (request, the tokens it feeds)
    let mut fed: Vec<(usize, Range<usize>)> = Vec::new();
    // Tokens of prompts and windows read this step: the first chunk always, more while they fit
    // in a chunk. A prompt under way goes on first (so the first to come is the first to be
    // answered), then the requests passed over longest, then the others as they came.
    let mut order: Vec<usize> = (0..live.len()).collect();
    order.sort_by_key(|&i| {
        let l = &live[i];
        let under_way = l.running.as_ref().is_some_and(|c| c.feeding.is_some());
        (
            std::cmp::Reverse(under_way),
            std::cmp::Reverse(l.passed_over),
        )
    });
    let mut read = 0;
    for i in order {
        if let Some(range) = live[i].next_feed(batch, tokenizer, stats, &mut read) {
            fed.push((i, range));
        }
    }
    stats.batch.store(fed.len() as u64, Ordering::Relaxed);
    if fed.is_empty() {
        if live.iter().any(|l| l.end.is_none()) {
            // Everyone left waits on a client: look again shortly, without spinning.
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        return;
    }
    let feeds: Vec<(usize, &[u32])> = fed
        .iter()
        .map(|(i, range)| (live[*i].stream, live[*i].tokens_in(range.clone())))
        .collect();
    let vocab = batch.vocab_size();
    let tokens = tokenizer.vocab_size().min(vocab);
    let model = Instant::now();
    let stepped = batch.step(&feeds);
    stats
        .model_micros
        .fetch_add(micros(model), Ordering::Relaxed);
    stats.steps.fetch_add(1, Ordering::Relaxed);
    stats
        .rows_fed
        .fetch_add(fed.len() as u64, Ordering::Relaxed);
    match stepped {
        Ok(logits) => {
            for (row, (i, _)) in fed.iter().enumerate() {
                let i = *i;
                let logits = &logits[row * vocab..row * vocab + tokens];
                live[i].accept(logits, tokenizer, stats);
            }
        }
        Err(e) => {
            for (i, _) in &fed {
                live[*i].fail(e.to_string(), stats);
            }
        }
    }
    stats
        .step_micros
        .fetch_add(micros(begun), Ordering::Relaxed);
}

/// What the log says once a worker's step of single tokens is recorded.
fn replay_note(graph: &Replay, rows: usize) -> String {
    match graph {
        Replay::Graph => {
            format!("the decode step of {rows} rows is recorded: one graph launch a step")
        }
        Replay::Rerun { why } => {
            format!("the decode step of {rows} rows runs launch by launch: {why}")
        }
    }
}

/// Microseconds since `since`.
fn micros(since: Instant) -> u64 {
    since.elapsed().as_micros() as u64
}
