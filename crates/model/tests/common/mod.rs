//! What the model crate's test files share.

use burn::tensor::{Device, DeviceType};

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

/// The first wgpu adapter (lavapipe in CI). None without one, said loudly: under CI that is a
/// failure, because `what` must be tested there.
#[allow(dead_code)] // Not every test file runs on wgpu.
pub fn wgpu_device(what: &str) -> Option<Device> {
    let device = Device::enumerate(DeviceType::Wgpu)
        .into_vec()
        .into_iter()
        .next();
    if device.is_none() {
        let msg = format!(
            "NO WGPU ADAPTER FOUND: {what} did not run (install mesa-vulkan-drivers for lavapipe)"
        );
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("\n!!! {msg} !!!\n");
    }
    device
}
