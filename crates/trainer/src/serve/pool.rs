//! The generation workers: a fixed number of threads fed from a bounded queue, each decoding up
//! to `max_batch` requests in one batch ([`batcher`]), on the fused CPU decoder or on Burn's
//! backends. The async request handlers never run the model: they hand a [`Job`] over and
//! await its events.
//!
//! [`batcher`]: super::batcher

use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::{Result, bail};
use tinygpt_model::gpu::Kernels;

use super::batcher;
use super::job::Decoding;
pub use super::job::{Job, Model};
pub use super::stats::Stats;

use crate::backend::EngineKind;
use crate::train::memory::human;

/// Why a job was not taken.
pub enum Refused {
    /// Every worker is busy and the queue is full.
    Busy,
    /// The server is shutting down.
    Closed,
}

/// The worker threads and the queue's sending end.
pub(crate) struct Pool {
    queue: Mutex<Option<SyncSender<Job>>>,
    pub stats: Arc<Stats>,
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// `workers` threads sharing `model`, each decoding up to `max_batch` requests at once on
    /// the fused engine, and a queue of `queue` waiting jobs.
    pub fn start(
        model: Arc<Model>,
        workers: usize,
        max_batch: usize,
        queue: usize,
    ) -> Result<Self> {
        let engine = engine(&model)?;
        model.weights.matrices(engine)?;
        check_memory(&model, workers, max_batch)?;
        let (sender, receiver) = sync_channel(queue);
        let jobs = Arc::new(batcher::Jobs::new(receiver, workers, max_batch));
        let stats = Arc::new(Stats::default());
        let handles = (0..workers)
            .map(|i| {
                let (model, jobs, stats) = (model.clone(), jobs.clone(), stats.clone());
                std::thread::Builder::new()
                    .name(format!("generate-{i}"))
                    .spawn(move || batcher::work(&model, engine, &jobs, i, &stats))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            queue: Mutex::new(Some(sender)),
            stats,
            workers: Mutex::new(handles),
        })
    }

    /// Queues `job`, or says why not at once (never waits).
    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
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
    pub(crate) fn shut_down(&self) {
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

/// The engine `model`'s workers decode on.
pub fn engine(model: &Model) -> Result<EngineKind> {
    crate::decoder::sampling_engine(&model.placement)
}

/// Refuses batches the machine cannot hold: each row keeps a KV cache of the model's
/// block_size where the model runs, and each worker on a GPU decodes on a copy of the weights
/// of its own (the fused decoder's workers share one, made already; Burn's workers on a CPU
/// share the model's).
fn check_memory(model: &Model, workers: usize, max_batch: usize) -> Result<()> {
    let (value_bytes, weights) = match &model.decoding {
        // Burn's caches are made in the matrices' dtype (`--weights bf16`: 2 bytes a value).
        Decoding::Burn(gpt) => (
            gpt.dtype().size(),
            match gpt.kernels() {
                Kernels::Cube => gpt.bytes() as u64,
                Kernels::Burn => 0,
            },
        ),
        Decoding::Fused(_) => (std::mem::size_of::<f32>(), 0),
    };
    let row = model.config.kv_cache_bytes(value_bytes) as u64;
    let need = workers as u64 * (max_batch as u64 * row + weights);
    match model.placement.available_memory() {
        Some(available) if need > available => bail!(
            "--max-batch {max_batch} on {workers} workers needs {} ({} of KV cache a row, {} \
             of weights a worker); {} is available: lower --max-batch or --max-concurrent",
            human(need),
            human(row),
            human(weights),
            human(available)
        ),
        _ => Ok(()),
    }
}
