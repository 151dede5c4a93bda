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
