//! [`SpinPool`]: a pool of spinning helper threads that share one sequence's matrix-vector
//! products while it decodes.
//!
//! A token of one sequence is ~120 products of a few hundred microseconds or less each, back
//! to back. Spawning threads per product (or waking a pool's sleeping ones) costs tens of
//! microseconds each time; these threads stay, spin briefly for the next product, and park
//! when decoding pauses, so a product is handed over in well under a microsecond while a
//! sequence decodes and costs nothing while it does not.
//!
//! A token's product is split by output columns, a prompt's (many rows) by rows, a token's
//! attention over a long cache by heads; every output is computed by the same code as on one
//! thread: the numbers do not depend on the number of threads.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a helper spins for the next product before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A part of a product: `job(part)` for `part` in `0..parts`, the caller running part 0.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// The job being run (a `Job` with its lifetime erased: see [`SpinPool::run`]).
    job: std::sync::Mutex<Option<Job<'static>>>,
    /// Products handed out so far; a helper runs each once.
    posted: AtomicUsize,
    /// Helpers done with the current product.
    done: AtomicUsize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

/// `count` helper threads (none: every product on the caller's thread).
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SpinPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpinPool({})", self.threads.len())
    }
}

impl SpinPool {
    /// `count` helpers, started now.
    pub(crate) fn new(count: usize) -> Self {
        let shared = Arc::new(Shared {
            job: std::sync::Mutex::new(None),
            posted: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let threads = (0..count)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("decode-{}", i + 1))
                    .spawn(move || help(&shared, i + 1))
                    .expect("a decoding helper thread starts")
            })
            .collect();
        Self { shared, threads }
    }

    /// Threads a product is split over: the helpers and the caller.
    pub(crate) fn parts(&self) -> usize {
        self.threads.len() + 1
    }

    /// Runs `job(0)` here and `job(1..parts)` on the helpers, returning when all are done.
    pub(crate) fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        if self.threads.is_empty() {
            return job(0);
        }
        let s = &self.shared;
        // SAFETY: the job's borrows outlive every use of it: the helpers run it only between
        // the post below and their `done` count, which this waits for before returning (even
        // when `job(0)` panics: see `Wait`), and the slot is emptied before returning.
        let erased: Job<'static> = unsafe { std::mem::transmute(job) };
        *s.job.lock().unwrap_or_else(|p| p.into_inner()) = Some(erased);
        s.done.store(0, Ordering::SeqCst);
        s.posted.fetch_add(1, Ordering::SeqCst);
        self.threads.iter().for_each(|t| t.thread().unpark());
        let _wait = Wait(self);
        job(0);
    }
}

/// Waits for the helpers' parts of the current product when dropped, so a product's borrows
/// are never used after [`SpinPool::run`] returns or unwinds.
struct Wait<'a>(&'a SpinPool);

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        let (s, helpers) = (&self.0.shared, self.0.threads.len());
        while s.done.load(Ordering::SeqCst) < helpers {
            std::hint::spin_loop();
        }
        *s.job.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if s.panicked.swap(false, Ordering::SeqCst) && !std::thread::panicking() {
            panic!("a decoding helper thread panicked");
        }
    }
}

impl Drop for SpinPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// A helper's loop: wait for a product (spinning, then parked), run part `part` of it, count
/// it done.
fn help(s: &Shared, part: usize) {
    let mut seen = 0;
    loop {
        let since = Instant::now();
        while s.posted.load(Ordering::SeqCst) == seen {
            if s.stop.load(Ordering::SeqCst) {
                return;
            }
            match since.elapsed() < SPIN {
                true => std::hint::spin_loop(),
                false => std::thread::park_timeout(Duration::from_millis(50)),
            }
        }
        seen = s.posted.load(Ordering::SeqCst);
        let job = *s.job.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(job) = job
            && catch_unwind(AssertUnwindSafe(|| job(part))).is_err()
        {
            s.panicked.store(true, Ordering::SeqCst);
        }
        s.done.fetch_add(1, Ordering::SeqCst);
    }
}

/// `out`'s pointer, shared by the parts of a product, each writing its own range.
struct Columns(*mut f32);

// SAFETY: every part writes a range no other part touches (see `split_columns`, `split_rows`).
unsafe impl Sync for Columns {}

impl Columns {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// `f(part, j0)` over [`SpinPool::parts`] consecutive column ranges `j0..j0 + part.len()` of
/// `out`, one on each thread: a product of one row split by outputs.
pub(crate) fn split_columns(
    helpers: &SpinPool,
    out: &mut [f32],
    f: &(dyn Fn(&mut [f32], usize) + Sync),
) {
    let (n, parts) = (out.len(), helpers.parts());
    let columns = Columns(out.as_mut_ptr());
    helpers.run(&|p| {
        let (j0, j1) = (n * p / parts, n * (p + 1) / parts);
        // SAFETY: the ranges of the parts are disjoint and inside `out`, which stays borrowed
        // mutably until every part is done (`run` returns only then).
        let part = unsafe { std::slice::from_raw_parts_mut(columns.get().add(j0), j1 - j0) };
        f(part, j0);
    });
}

/// `f(part, r0)` over [`SpinPool::parts`] consecutive ranges of whole rows of `out` (rows of
/// `row_len` values; `part` holds rows `r0..`), one on each thread: a product of many rows
/// (a prompt's chunk) split by rows. A thread left without rows does nothing.
pub(crate) fn split_rows(
    helpers: &SpinPool,
    out: &mut [f32],
    row_len: usize,
    f: &(dyn Fn(&mut [f32], usize) + Sync),
) {
    let (rows, parts) = (out.len() / row_len, helpers.parts());
    let start = Columns(out.as_mut_ptr());
    helpers.run(&|p| {
        let (r0, r1) = (rows * p / parts, rows * (p + 1) / parts);
        if r1 > r0 {
            // SAFETY: the parts' rows are disjoint and inside `out`, which stays borrowed
            // mutably until every part is done (`run` returns only then).
            let part = unsafe {
                std::slice::from_raw_parts_mut(start.get().add(r0 * row_len), (r1 - r0) * row_len)
            };
            f(part, r0);
        }
    });
}

/// A thread's share of a row split by heads: `(first head, its heads' outputs, its scratch)`.
type HeadsJob<'a> = &'a (dyn Fn(usize, &mut [f32], &mut [f32]) + Sync);

/// `f(first, part, scratch)` over [`SpinPool::parts`] consecutive ranges of whole heads of `y`
/// (heads of `head` values; `part` holds heads `first..`), each thread with its own `scratch`
/// of `scratch_len` values: one row's attention split by heads. A thread left without heads
/// does nothing.
pub(crate) fn split_heads(
    helpers: &SpinPool,
    y: &mut [f32],
    head: usize,
    scratch: &mut [f32],
    scratch_len: usize,
    f: HeadsJob<'_>,
) {
    let (heads, parts) = (y.len() / head, helpers.parts());
    assert!(
        scratch.len() >= parts * scratch_len,
        "a scratch row for each thread"
    );
    let (y_at, scratch_at) = (Columns(y.as_mut_ptr()), Columns(scratch.as_mut_ptr()));
    helpers.run(&|p| {
        let (h0, h1) = (heads * p / parts, heads * (p + 1) / parts);
        if h1 > h0 {
            // SAFETY: the parts' heads and scratch rows are disjoint and inside `y` and
            // `scratch`, which stay borrowed mutably until every part is done.
            let (part, scratch) = unsafe {
                (
                    std::slice::from_raw_parts_mut(y_at.get().add(h0 * head), (h1 - h0) * head),
                    std::slice::from_raw_parts_mut(
                        scratch_at.get().add(p * scratch_len),
                        scratch_len,
                    ),
                )
            };
            f(h0, part, scratch);
        }
    });
}
