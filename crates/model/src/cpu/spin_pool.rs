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

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long a thread spins for the next product (a helper) or for the helpers' parts (the
/// caller) before it parks.
const SPIN: Duration = Duration::from_micros(200);

/// A part of a product: `job(part)` for `part` in `0..parts`, the caller running part 0.
type Job<'a> = &'a (dyn Fn(usize) + Sync);

/// The product being run: its job (lifetime erased: see [`Helpers::run`]) and the thread
/// that waits for it.
#[derive(Clone)]
struct Posted {
    job: Job<'static>,
    caller: Thread,
}

struct Shared {
    /// The product being run, between [`Helpers::run`]'s post and its wait's end.
    slot: std::sync::Mutex<Option<Posted>>,
    /// Products handed out so far; a helper runs each once.
    posted: AtomicUsize,
    /// Helpers done with the current product.
    done: AtomicUsize,
    helpers: usize,
    panicked: AtomicBool,
    stop: AtomicBool,
}

/// `count` helper threads (none: every product on the caller's thread). Products run
/// through [`Helpers`], which [`hold`](Self::hold) lends for as long as the pool is borrowed
/// mutably.
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
            slot: std::sync::Mutex::new(None),
            posted: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            helpers: count,
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

    /// The helpers, for the products of one thread while the pool stays borrowed.
    pub(crate) fn hold(&mut self) -> Helpers<'_> {
        Helpers {
            pool: self,
            busy: Cell::new(false),
        }
    }
}

/// A [`SpinPool`] held by one thread for its products: one product at a time, by
/// construction. A pool lends one `Helpers` at a time ([`SpinPool::hold`] borrows it
/// mutably); `Helpers` is not `Sync`, so no other thread can start a product with it, nor can
/// a job (which must be `Sync`) capture it; and a product started from inside another on the
/// same thread (through a thread-local, say) is refused by `busy` before it touches the slot.
pub(crate) struct Helpers<'p> {
    pool: &'p SpinPool,
    /// A product is running; also what makes `Helpers` not `Sync`.
    busy: Cell<bool>,
}

impl Helpers<'_> {
    /// Threads a product is split over: the helpers and the caller.
    pub(crate) fn parts(&self) -> usize {
        self.pool.parts()
    }

    /// Runs `job(0)` here and `job(1..parts)` on the helpers, returning when all are done.
    ///
    /// # Panics
    /// If called while a product of these helpers runs (from inside its job), or if a part
    /// panics.
    pub(crate) fn run(&self, job: &(dyn Fn(usize) + Sync)) {
        assert!(
            !self.busy.replace(true),
            "a SpinPool runs one product at a time"
        );
        // From here on `Wait` clears `busy`, once the helpers are done, even if `job(0)` panics.
        let _wait = Wait(self);
        if self.pool.threads.is_empty() {
            return job(0);
        }
        let s = &self.pool.shared;
        // SAFETY: the helpers use the job only between the post below and their `done` count,
        // which `_wait` waits for before this returns or unwinds; the slot is emptied then.
        // No other product can overwrite the slot or the counts meanwhile: only this
        // `Helpers` can start one (the pool is borrowed mutably while it lives), no other
        // thread can call it (it is not `Sync`), and `busy` was false (no product of it runs
        // further up this thread's stack).
        let erased: Job<'static> = unsafe { std::mem::transmute(job) };
        let caller = std::thread::current();
        *s.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Posted {
            job: erased,
            caller,
        });
        s.done.store(0, Ordering::SeqCst);
        s.posted.fetch_add(1, Ordering::SeqCst);
        self.pool.threads.iter().for_each(|t| t.thread().unpark());
        job(0);
    }
}

/// Waits for the helpers' parts of the current product when dropped (spinning briefly, then
/// parked until the last helper wakes it), so a product's borrows are never used after
/// [`Helpers::run`] returns or unwinds.
struct Wait<'a, 'p>(&'a Helpers<'p>);

impl Drop for Wait<'_, '_> {
    fn drop(&mut self) {
        let (pool, s) = (self.0.pool, &self.0.pool.shared);
        let done = || s.done.load(Ordering::SeqCst) >= pool.threads.len();
        let since = Instant::now();
        while !done() && since.elapsed() < SPIN {
            std::hint::spin_loop();
        }
        // The last helper unparks this thread after its count; a wake-up for any other
        // reason only checks again.
        while !done() {
            std::thread::park();
        }
        *s.slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.0.busy.set(false);
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
/// it done, and wake the caller if it was the last.
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
        let posted = s.slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(Posted { job, caller }) = posted else {
            // Unreachable: the slot is filled before `posted` moves and emptied only after
            // every helper's count; counted anyway so the caller never waits for it.
            s.done.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        if catch_unwind(AssertUnwindSafe(|| job(part))).is_err() {
            s.panicked.store(true, Ordering::SeqCst);
        }
        if s.done.fetch_add(1, Ordering::SeqCst) + 1 == s.helpers {
            caller.unpark();
        }
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

/// `f(part, j0)` over [`Helpers::parts`] consecutive column ranges `j0..j0 + part.len()` of
/// `out`, one on each thread: a product of one row split by outputs.
pub(crate) fn split_columns(
    helpers: &Helpers<'_>,
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

/// `f(part, r0)` over [`Helpers::parts`] consecutive ranges of whole rows of `out` (rows of
/// `row_len` values; `part` holds rows `r0..`), one on each thread: a product of many rows
/// (a prompt's chunk) split by rows. A thread left without rows does nothing.
pub(crate) fn split_rows(
    helpers: &Helpers<'_>,
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

/// `f(first, part, scratch)` over [`Helpers::parts`] consecutive ranges of whole heads of `y`
/// (heads of `head` values; `part` holds heads `first..`), each thread with its own `scratch`
/// of `scratch_len` values: one row's attention split by heads. A thread left without heads
/// does nothing.
pub(crate) fn split_heads(
    helpers: &Helpers<'_>,
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

/// Compiles only while [`Helpers`] is not `Sync` (two impls of `NotSync` would then apply and
/// the call below would be ambiguous): the soundness of [`Helpers::run`] rests on it.
const _: fn() = || {
    trait NotSync<A> {
        fn check() {}
    }
    impl<T: ?Sized> NotSync<()> for T {}
    impl<T: ?Sized + Sync> NotSync<u8> for T {}
    <Helpers<'static> as NotSync<_>>::check();
};

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Every part of every product runs once, on its own thread, before `run` returns; also when
    /// a part outlasts the caller's spin and the caller parks.
    #[test]
    fn every_part_runs_once_before_run_returns() {
        let mut pool = SpinPool::new(2);
        let helpers = pool.hold();
        let counts: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for product in 0..2000 {
            helpers.run(&|part| {
                if product % 500 == 0 && part == 2 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                counts[part].fetch_add(1, Ordering::SeqCst);
            });
            for (part, count) in counts.iter().enumerate() {
                assert_eq!(count.load(Ordering::SeqCst), product + 1, "part {part}");
            }
        }
    }

    /// A product started from inside another (the helpers reached through a thread-local) is
    /// refused, and the helpers run the next product as usual.
    #[test]
    fn a_product_inside_a_product_is_refused() {
        thread_local! {
            static HELPERS: Helpers<'static> = Box::leak(Box::new(SpinPool::new(1))).hold();
        }
        let nested = |part: usize| {
            if part == 0 {
                HELPERS.with(|h| h.run(&|_| {}));
            }
        };
        let refused = catch_unwind(|| HELPERS.with(|h| h.run(&nested))).unwrap_err();
        assert_eq!(
            refused.downcast_ref::<&str>(),
            Some(&"a SpinPool runs one product at a time")
        );
        let ran = AtomicUsize::new(0);
        HELPERS.with(|h| h.run(&|_| _ = ran.fetch_add(1, Ordering::SeqCst)));
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    /// A helper's panic reaches the caller once every part is done, and the pool goes on.
    #[test]
    fn a_helpers_panic_reaches_the_caller() {
        let mut pool = SpinPool::new(1);
        let helpers = pool.hold();
        let caught = catch_unwind(AssertUnwindSafe(|| {
            helpers.run(&|part| assert!(part == 0, "part {part} fails"))
        }));
        assert!(caught.is_err());
        let ran = AtomicUsize::new(0);
        helpers.run(&|_| _ = ran.fetch_add(1, Ordering::SeqCst));
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }
}
