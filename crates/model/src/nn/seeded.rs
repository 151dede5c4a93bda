//! Seeding Burn's random streams so that what is drawn next is the seed's.
//!
//! Burn keeps one random stream per backend for the whole process (flex's, ndarray's, and one
//! that every wgpu and CUDA device shares), and draws a parameter's initial values lazily, at
//! its first use. Two trainers in one process (a library user's threads, or tests) that seed and
//! draw at once interleave their draws, and a seeded run starts from other weights. Every draw
//! that must repeat from a seed happens while the guard [`seeded`] returns is held: one lock for
//! all the streams, so two trainers' steps through Burn take turns even on two devices.

use std::sync::{Mutex, MutexGuard};

use burn::tensor::Device;

/// Locks the process's random streams, seeds `device`'s with `seed`, and returns the lock:
/// draws made on `device` until the guard drops come from `seed` alone. Never call it again on
/// the same thread while holding its guard (the lock is not re-entrant).
pub fn seeded(device: &Device, seed: u64) -> MutexGuard<'static, ()> {
    static STREAMS: Mutex<()> = Mutex::new(());
    // A thread that panicked while drawing leaves nothing half-done here: the next holder
    // seeds again before it draws.
    let guard = STREAMS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    device.seed(seed);
    guard
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Distribution, Tensor};

    use super::*;

    /// Draws from `seed` in four pieces, letting other threads run between them.
    fn draw(device: &Device, seed: u64) -> Vec<f32> {
        let _streams = seeded(device, seed);
        let mut values = Vec::new();
        for _ in 0..4 {
            let piece = Tensor::<1>::random([16], Distribution::Default, device);
            values.extend(piece.into_data().try_to_vec::<f32>().unwrap());
            std::thread::yield_now();
        }
        values
    }

    /// Eight threads seeding and drawing at once each draw what their seed alone draws. (The
    /// ndarray device: no other test in this crate draws from it.)
    #[test]
    fn draws_under_the_guard_are_the_seeds_alone() {
        #[allow(deprecated)]
        let device = Device::ndarray();
        let alone: Vec<_> = (0..8).map(|seed| draw(&device, seed)).collect();
        assert_ne!(alone[0], alone[1], "two seeds draw the same numbers");
        std::thread::scope(|scope| {
            for (seed, expected) in alone.iter().enumerate() {
                let device = device.clone();
                scope.spawn(move || {
                    for _ in 0..25 {
                        assert_eq!(&draw(&device, seed as u64), expected, "seed {seed}");
                    }
                });
            }
        });
    }
}
