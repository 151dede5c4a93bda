//! The server's counters: what `/health` reports (and the tests read: a cancelled generation
//! shows here).

use std::sync::atomic::AtomicU64;

use serde::Serialize;

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
