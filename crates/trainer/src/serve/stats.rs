//! The server's counters: what `/health` reports (and the tests read: a cancelled generation
//! shows here).

use std::sync::atomic::AtomicU64;

use serde::Serialize;

/// Counters, read by `/health` (and by the tests: a cancelled generation shows here).
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// Generations running now.
    pub active: AtomicU64,
    /// Rows in the step decoded last (continuous batching: the requests a worker fed at once).
    pub batch: AtomicU64,
    /// Jobs waiting for a worker.
    pub queued: AtomicU64,
    pub completed: AtomicU64,
    /// Generations stopped because their client went away (or stopped reading: see
    /// `write_timeouts`).
    pub cancelled: AtomicU64,
    /// Requests refused with 429 because the queue was full.
    pub rejected: AtomicU64,
    pub failed: AtomicU64,
    /// Tokens generated, all requests together.
    pub tokens: AtomicU64,
    /// Batch steps the workers ran (each feeds every request that can go on).
    pub steps: AtomicU64,
    /// Requests fed, all steps together: `rows_fed / steps` is the mean batch.
    pub rows_fed: AtomicU64,
    /// Times a request sat out a step because its client had not taken the tokens before.
    pub client_stalls: AtomicU64,
    /// Microseconds of the steps spent in the model (its batch step, logits read back)…
    pub model_micros: AtomicU64,
    /// …and in the whole step (choosing the feeds, sampling, the events to the clients): the
    /// difference is the server's own work.
    pub step_micros: AtomicU64,
    /// Connections open now.
    pub connections: AtomicU64,
    /// Connections closed at once because --max-connections were open.
    pub connections_refused: AtomicU64,
    /// Connections closed because a request's head (or the next request on an idle one) did
    /// not arrive within --header-timeout.
    pub header_timeouts: AtomicU64,
    /// Requests answered 408 because their body did not arrive within --body-timeout.
    pub body_timeouts: AtomicU64,
    /// Connections cut off because their client took nothing of the answer for
    /// --write-timeout.
    pub write_timeouts: AtomicU64,
}
