//! What the model crate's test files share.

use burn::tensor::{Device, DeviceType};
use tinygpt_model::{Decoder, ModelError, Pick, Picked};

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

/// The first wgpu adapter (lavapipe in CI). The tests that call this are marked
/// `#[cfg_attr(no_wgpu, ignore = ...)]`: the crate's build script sets `no_wgpu` on a machine
/// without a Vulkan driver (never under CI), so reaching here without an adapter is a failure.
#[allow(dead_code)] // Not every test file runs on wgpu.
pub fn wgpu_device() -> Device {
    Device::enumerate(DeviceType::Wgpu)
        .into_vec()
        .into_iter()
        .next()
        .expect("NO WGPU ADAPTER FOUND: install mesa-vulkan-drivers for lavapipe")
}

/// A decoder that counts what is asked of it: tokens fed, cache clears, logits read back to the
/// host, tokens picked on the device.
#[allow(dead_code)] // Not every test file counts.
pub struct Counted<D> {
    pub inner: D,
    pub fed: usize,
    pub clears: usize,
    pub logits_read: usize,
    pub picked_on_device: usize,
}

#[allow(dead_code)]
impl<D: Decoder> Counted<D> {
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            fed: 0,
            clears: 0,
            logits_read: 0,
            picked_on_device: 0,
        }
    }
}

impl<D: Decoder> Decoder for Counted<D> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn cached(&self) -> usize {
        self.inner.cached()
    }
    fn clear(&mut self) {
        self.clears += 1;
        self.inner.clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.fed += tokens.len();
        self.logits_read += 1;
        self.inner.feed(tokens)
    }
    fn picks_on_device(&self) -> bool {
        self.inner.picks_on_device()
    }
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        self.fed += tokens.len();
        self.picked_on_device += 1;
        self.inner.feed_and_pick(tokens, pick)
    }
}
