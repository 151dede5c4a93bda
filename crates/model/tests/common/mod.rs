//! What the model crate's test files share.

use burn::tensor::Device;

/// Weights and inputs are drawn from the CPU backends' generators, which every test thread
/// shares (and Burn draws weights lazily, at first use): each test holds this lock and seeds the
/// generators first, so its numbers are the same on every run.
pub fn seeded() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    #[allow(deprecated)]
    let ndarray = Device::ndarray();
    for device in [Device::flex(), ndarray] {
        device.seed(20261122);
    }
    guard
}
