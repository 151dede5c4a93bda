//! The generation workers: a fixed number of threads, each with its own decoder (and so its
//! own KV cache), fed from a bounded queue. The async request handlers never run the model:
//! they hand a [`Job`] over and await its events.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::Result;
use tinygpt_model::Gpt;
use tokio::sync::{mpsc, oneshot};

use super::generation::{self, Event, Generation};
pub use super::stats::Stats;
use crate::attention_maps::AttentionMaps;
use crate::backend::Placement;
use crate::data::tokenizer::Tokenizer;
use crate::decoder::decoder;

/// What the workers need of the model: its weights, where they live, its tokenizer.
pub struct Model {
    pub gpt: Gpt,
    pub placement: Placement,
    pub tokenizer: Tokenizer,
}

/// Work for a generation thread.
pub enum Job {
    Complete {
        generation: Generation,
        /// Text as it is generated, then [`Event::Finished`] per choice; closed when the job
        /// ends. Bounded: a client that reads slowly holds its generation back instead of
        /// piling text up in memory. Dropping the receiver (a client that went away) cancels
        /// the generation at its next token.
        events: mpsc::Sender<Event>,
    },
    Attention {
        ids: Vec<u32>,
        reply: oneshot::Sender<Result<AttentionMaps>>,
    },
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
            Job::Complete { generation, events } => {
                generation::run(&mut *decoder, &model.tokenizer, &generation, &events, stats)
            }
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
