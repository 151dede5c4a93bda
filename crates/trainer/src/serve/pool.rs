//! The generation workers: a fixed number of threads, each with its own decoder (and so its
//! own KV cache), fed from a bounded queue. The async request handlers never run the model:
//! they hand a [`Job`] over and await its events.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
use tinygpt_model::{Decoder, GenerateOptions, Gpt, generate_cancellable};
use tokio::sync::{mpsc, oneshot};

use crate::backend::Placement;
use crate::data::tokenizer::{TextStream, Tokenizer};
use crate::inspect::AttentionMaps;
use crate::sample::decoder;

/// What the workers need of the model: its weights, where they live, its tokenizer.
pub struct Model {
    pub gpt: Gpt,
    pub placement: Placement,
    pub tokenizer: Tokenizer,
}

/// Work for a generation thread.
pub enum Job {
    Complete {
        prompt: Vec<u32>,
        options: GenerateOptions,
        /// Text as it is generated, then [`Event::Finished`]. Bounded: a client that reads
        /// slowly holds its generation back instead of piling text up in memory. Dropping the
        /// receiver (a client that went away) cancels the generation at its next token.
        events: mpsc::Sender<Event>,
    },
    Attention {
        ids: Vec<u32>,
        reply: oneshot::Sender<Result<AttentionMaps>>,
    },
}

/// What a completion job reports.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Finished {
        completion_tokens: usize,
        /// OpenAI's `finish_reason`: "stop" (a stop sequence) or "length" (`max_tokens`).
        reason: &'static str,
    },
    Failed(String),
}

/// Counters, read by `/health` (and by the tests: a cancelled generation shows here).
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// Generations running now.
    pub active: AtomicU64,
    /// Jobs waiting for a worker.
    pub queued: AtomicU64,
    pub completed: AtomicU64,
    /// Generations stopped because their client went away.
    pub cancelled: AtomicU64,
    /// Requests refused with 429 because the queue was full.
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    /// Tokens generated, all requests together.
    pub tokens: AtomicU64,
}

/// Why a job was not taken.
pub enum Refused {
    /// Every worker is busy and the queue is full.
    Busy,
    /// The server is shutting down.
    Closed,
}

/// The worker threads and the queue's sending end.
pub struct Pool {
    queue: Mutex<Option<SyncSender<Job>>>,
    pub stats: Arc<Stats>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// `workers` threads sharing `model`, and a queue of `queue` waiting jobs.
    pub fn start(model: Arc<Model>, workers: usize, queue: usize) -> Result<Self> {
        // A decoder the engine cannot build (an explicit `--backend fused` on a model it does
        // not implement) is an error now, not in every worker.
        drop(decoder(
            &model.placement,
            &model.gpt,
            model.tokenizer.vocab_size(),
        )?);
        let (sender, receiver) = sync_channel(queue);
        let receiver = Arc::new(Mutex::new(receiver));
        let stats = Arc::new(Stats::default());
        let handles = (0..workers)
            .map(|i| {
                let (model, receiver, stats) = (model.clone(), receiver.clone(), stats.clone());
                std::thread::Builder::new()
                    .name(format!("generate-{i}"))
                    .spawn(move || work(&model, &receiver, &stats))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            queue: Mutex::new(Some(sender)),
            stats,
            workers: Mutex::new(handles),
        })
    }

    /// Queues `job`, or says why not at once (never waits).
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        let queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = queue.as_ref().ok_or(Refused::Closed)?;
        // Counted before the send: a worker may take the job (and count it down) at once.
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        let refused = match sender.try_send(job) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => Refused::Busy,
            Err(TrySendError::Disconnected(_)) => Refused::Closed,
        };
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        if matches!(refused, Refused::Busy) {
            self.stats.rejected.fetch_add(1, Ordering::SeqCst);
        }
        Err(refused)
    }

    /// Closes the queue, lets the workers finish what they hold, and waits for them.
    pub fn shut_down(&self) {
        drop(
            self.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let handles =
            std::mem::take(&mut *self.workers.lock().unwrap_or_else(PoisonError::into_inner));
        for handle in handles {
            let _ = handle.join();
        }
    }
}

/// One worker: a decoder of its own, reused for every job it takes.
fn work(model: &Model, jobs: &Mutex<Receiver<Job>>, stats: &Stats) {
    let vocab = model.tokenizer.vocab_size();
    let Ok(mut decoder) = decoder(&model.placement, &model.gpt, vocab) else {
        return; // `Pool::start` built one already: this does not happen.
    };
    loop {
        let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else {
            return; // The queue is closed: the server is stopping.
        };
        stats.queued.fetch_sub(1, Ordering::SeqCst);
        stats.active.fetch_add(1, Ordering::SeqCst);
        match job {
            Job::Complete {
                prompt,
                options,
                events,
            } => complete(
                &mut *decoder,
                &model.tokenizer,
                &prompt,
                &options,
                &events,
                stats,
            ),
            Job::Attention { ids, reply } => {
                let maps = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    AttentionMaps::of_tokens(
                        &model.gpt,
                        &model.tokenizer,
                        &ids,
                        &model.placement.device,
                    )
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("internal error computing attention")));
                let _ = reply.send(maps);
            }
        }
        stats.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Generates for one request, sending text as it comes; stops early when the client is gone.
fn complete(
    decoder: &mut dyn Decoder,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    events: &mpsc::Sender<Event>,
    stats: &Stats,
) {
    let started = Instant::now();
    if events.is_closed() {
        stats.cancelled.fetch_add(1, Ordering::SeqCst);
        eprintln!("serve: cancelled before it started (the client went away while queued)");
        return;
    }
    let mut text = TextStream::new(tokenizer);
    let mut gone = false;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        generate_cancellable(decoder, prompt, options, |id| {
            stats.tokens.fetch_add(1, Ordering::Relaxed);
            let sent = match text.push(id) {
                Some(piece) => events.blocking_send(Event::Text(piece)).is_ok(),
                None => !events.is_closed(),
            };
            gone = !sent;
            match sent {
                true => ControlFlow::Continue(()),
                false => ControlFlow::Break(()),
            }
        })
    }));
    let seconds = started.elapsed().as_secs_f64();
    match result {
        Ok(Ok(tokens)) if gone => {
            stats.cancelled.fetch_add(1, Ordering::SeqCst);
            eprintln!(
                "serve: cancelled after {} tokens in {seconds:.2} s (the client went away)",
                tokens.len()
            );
        }
        Ok(Ok(tokens)) => {
            let reason = match tokens.len() < options.max_new_tokens {
                true => "stop",
                false => "length",
            };
            stats.completed.fetch_add(1, Ordering::SeqCst);
            eprintln!(
                "serve: {} prompt + {} tokens in {seconds:.2} s ({reason})",
                prompt.len(),
                tokens.len()
            );
            let _ = events.blocking_send(Event::Finished {
                completion_tokens: tokens.len(),
                reason,
            });
        }
        Ok(Err(e)) => {
            stats.failed.fetch_add(1, Ordering::SeqCst);
            let _ = events.blocking_send(Event::Failed(e.to_string()));
        }
        Err(_) => {
            stats.failed.fetch_add(1, Ordering::SeqCst);
            eprintln!("serve: internal error during generation (a bug in tinygpt)");
            let _ = events.blocking_send(Event::Failed("internal error during generation".into()));
        }
    }
}
