//! Asking for a decoding product's next weight rows before the product reaches them.
//!
//! A token's product reads each weight row from memory once, in order, and spends a few
//! instructions per cache line on it: the time is the reading. Intel's prefetchers follow
//! such a stream only inside a 4 KiB page and start over after each, so a thread alone keeps
//! too few lines in flight to read at the memory's rate. Asking for the lines a fixed distance
//! ahead keeps them coming across the pages' edges. (SmolLM2-135M's shape on a 2-vCPU Xeon: f32
//! 31.5 → 36.8 tokens/s, int8 by a quarter or more; see docs/perf.md.)
//!
//! Only Intel's CPUs are asked: on an AMD Zen 4 the hints made the same decoding no faster and
//! mostly slower (SmolLM2's shape, int8, the hints switched off and on in one binary, eight
//! alternated pairs: median 202 tokens/s without, 180 with), and no distance from 2 to 16 KiB
//! nor a hint to L2 did better than none: its own prefetchers keep up with rows read from
//! memory. (Only a model whose weights stay in L3, shakespeare-char's size in int8, gained from
//! them there, 7%; docs/perf.md has the figures.)

/// How far ahead of the row being multiplied a thread asks for the weights, in bytes: far
/// enough that a line asked for is in cache by the time its row comes (a few microseconds of
/// reading), near enough that it is still there (a core's L1 holds 32–48 KiB).
const AHEAD: usize = 8 * 1024;

/// How many rows of `row_bytes` each make up the distance ahead (at least one).
pub(crate) fn rows_ahead(row_bytes: usize) -> usize {
    AHEAD.div_ceil(row_bytes.max(1)).max(1)
}

/// Whether this CPU is one the hints pay on (Intel's), found once per process.
#[cfg(target_arch = "x86_64")]
fn pays() -> bool {
    static PAYS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAYS.get_or_init(|| {
        // Leaf 0 gives the vendor's name in ebx, edx, ecx: "Genu" "ineI" "ntel".
        #[allow(unused_unsafe)] // `__cpuid` is safe to call from Rust 1.87 on
        // SAFETY: every x86-64 CPU has the `cpuid` instruction and its leaf 0.
        let leaf = unsafe { std::arch::x86_64::__cpuid(0) };
        [leaf.ebx, leaf.edx, leaf.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e]
    })
}

/// Asks the CPU to bring `data`'s cache lines into its nearest cache. A hint only: the numbers
/// never depend on it, and on CPUs without the instruction, or where it does not pay, it does
/// nothing.
#[inline(always)]
pub(crate) fn lines<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    if pays() {
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

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// The vendor read from `cpuid` is the one the kernel reports.
    #[test]
    fn asks_ahead_on_intels_cpus_only() {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("vendor_id"))
            .and_then(|l| l.split(':').nth(1))
            .map(str::trim)
            .expect("a vendor_id line");
        assert_eq!(super::pays(), vendor == "GenuineIntel", "vendor {vendor}");
    }
}
