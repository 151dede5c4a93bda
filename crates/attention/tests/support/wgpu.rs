//! The wgpu devices the tests run on, one file for the test files of every crate in the
//! workspace (each includes it with `#[path]`).
//!
//! A wgpu device does its work on a thread of its own: compiling each new kernel (on lavapipe,
//! CI's software Vulkan, most of a wgpu test's time) and launching it. Two tests that run at once
//! on one device take turns there, and one of the two cores waits. [`wgpu_device_of_two`] gives
//! the tests two devices on the one adapter instead.

// Each test file uses what it needs of this.
#![allow(dead_code)]

use std::cell::OnceCell;
use std::sync::Mutex;

use burn::tensor::{Device, DeviceKind, DeviceType};

/// The first wgpu adapter (lavapipe in CI). The tests that call this are marked
/// `#[cfg_attr(no_wgpu, ignore = ...)]`: the crate's build script sets `no_wgpu` on a machine
/// without a Vulkan driver (never under CI), so reaching here without an adapter is a failure.
///
/// For a test that holds a lock shared with the other tests of its file while it runs on wgpu:
/// they take turns anyway, and on one device each kernel is compiled once.
pub fn wgpu_device() -> Device {
    hold(Some(0));
    first_adapter()
}

/// One of two devices on the first wgpu adapter (itself and the runtime's default, which a
/// machine whose only adapter is lavapipe resolves to the same one): the one fewer running
/// tests hold. The calling thread (the test) keeps it until it ends, so that every tensor of a
/// test lives on one device.
///
/// For a test that runs on wgpu without a lock shared with the others: two such tests compile
/// and run their kernels side by side. A kernel both use is compiled on each device (Mesa's
/// shader cache on disk spares the second most of that).
pub fn wgpu_device_of_two() -> Device {
    // Looked up for the second device too, so that a machine without an adapter fails here
    // with the same message.
    let first = first_adapter();
    match hold(None) {
        0 => first,
        _ => Device::wgpu(DeviceKind::DefaultDevice),
    }
}

fn first_adapter() -> Device {
    Device::enumerate(DeviceType::Wgpu)
        .into_vec()
        .into_iter()
        .next()
        .expect("NO WGPU ADAPTER FOUND: install mesa-vulkan-drivers for lavapipe")
}

/// The device this thread holds: the one it took first, else `wanted`, else the one fewer
/// running tests hold.
fn hold(wanted: Option<usize>) -> usize {
    HELD.with(|held| {
        held.get_or_init(|| {
            let mut holders = HOLDERS
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let index = wanted.unwrap_or(usize::from(holders[1] < holders[0]));
            holders[index] += 1;
            Held(index)
        })
        .0
    })
}

/// How many running tests hold each of the two devices.
static HOLDERS: Mutex<[usize; 2]> = Mutex::new([0, 0]);

thread_local! {
    /// The device this thread holds, given back when the thread (the test) ends.
    static HELD: OnceCell<Held> = const { OnceCell::new() };
}

struct Held(usize);

impl Drop for Held {
    fn drop(&mut self) {
        let mut holders = HOLDERS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        holders[self.0] -= 1;
    }
}
