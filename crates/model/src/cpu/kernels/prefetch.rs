//! Asking for a decoding product's next weight rows before the product reaches them.
//!
//! A token's product reads each weight row from memory once, in order, and spends a few
//! instructions per cache line on it: the time is the reading. The CPU's own prefetchers follow
//! such a stream only inside a 4 KiB page and start over after each, so a thread alone keeps
//! too few lines in flight to read at the memory's rate. Asking for the lines a fixed distance
//! ahead keeps them coming across the pages' edges. (SmolLM2-135M's shape on a 2-vCPU Xeon: f32
//! 31.5 → 36.8 tokens/s, int8 by a quarter or more; see docs/perf.md.)

/// How far ahead of the row being multiplied a thread asks for the weights, in bytes: far
/// enough that a line asked for is in cache by the time its row comes (a few microseconds of
/// reading), near enough that it is still there (a core's L1 holds 32–48 KiB).
const AHEAD: usize = 8 * 1024;

/// How many rows of `row_bytes` each make up the distance ahead (at least one).
pub(crate) fn rows_ahead(row_bytes: usize) -> usize {
    AHEAD.div_ceil(row_bytes.max(1)).max(1)
}

/// Asks the CPU to bring `data`'s cache lines into its nearest cache. A hint only: the numbers
/// never depend on it, and on CPUs without the instruction it does nothing.
#[inline(always)]
pub(crate) fn lines<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let (start, bytes) = (data.as_ptr().cast::<i8>(), std::mem::size_of_val(data));
        for at in (0..bytes).step_by(64) {
            // SAFETY: `at` is inside `data`; a prefetch neither reads nor faults in any case.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(at)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}
