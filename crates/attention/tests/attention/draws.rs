//! Where the tests' numbers come from: a generator of each test's own, on the host.
//!
//! Burn's random tensors come from one generator per backend, shared by every thread: a test
//! that drew from it would have to hold a lock shared with every other test of the file for its
//! whole run (or see different numbers on each run), and the tests would take turns, on wgpu at
//! the pace of one device thread. Drawn here, inputs and weights are the same on every run and
//! on every backend, and the tests run side by side. Dropout alone draws on the device (see
//! `run_with_dropout` in `main.rs`).

use std::cell::Cell;

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use tinygpt_attention::{CausalSelfAttention, CausalSelfAttentionConfig};

use super::normals::{normals_from, start};

/// The seed of every test's generator, and of the device generators the dropout tests use.
pub const SEED: u64 = 20261122;

thread_local! {
    /// This thread's (this test's) generator.
    static STATE: Cell<u64> = const { Cell::new(start(SEED)) };
}

/// Starts this test's draws from the beginning, so that its numbers do not depend on what ran
/// before it on the same thread.
pub fn fresh_draws() {
    STATE.with(|state| state.set(start(SEED)));
}

/// The next `n` draws of N(0, 1) of this test's generator.
fn normals(n: usize) -> Vec<f32> {
    STATE.with(|state| {
        let mut s = state.get();
        let drawn = normals_from(&mut s, n);
        state.set(s);
        drawn
    })
}

/// A tensor of N(0, 1) draws.
pub fn random<const D: usize>(shape: [usize; D], device: &Device) -> Tensor<D> {
    let n = shape.iter().product();
    Tensor::from_data(TensorData::new(normals(n), shape), device)
}

/// The layer `config` builds, its matrices drawn here from the normal its `init` draws them
/// from on the device (N(0, `init_std`) for the q/k/v projection, N(0, `proj_init_std`) for the
/// output's); the biases are zeros either way. The parameters stay lazy, as `init`'s are, so
/// moving the layer (to an autodiff device) moves where they are created.
pub fn drawn(config: &CausalSelfAttentionConfig, device: &Device) -> CausalSelfAttention {
    let mut layer = config.init(device).unwrap();
    layer.c_attn.weight = matrix(&layer.c_attn.weight, config.init_std);
    let proj_std = config.proj_init_std.unwrap_or(config.init_std);
    layer.c_proj.weight = matrix(&layer.c_proj.weight, proj_std);
    layer
}

/// A parameter of `like`'s id, shape and device, N(0, `std`) drawn here.
fn matrix(like: &Param<Tensor<2>>, std: f64) -> Param<Tensor<2>> {
    let shape = like.lazy_shape();
    let scaled = normals(shape.num_elements())
        .into_iter()
        .map(|x| (f64::from(x) * std) as f32)
        .collect();
    let data = TensorData::new(scaled, shape.clone());
    Param::uninitialized(
        like.id,
        move |device, require_grad| {
            let tensor = Tensor::from_data(data.clone(), device);
            match require_grad {
                true => tensor.require_grad(),
                false => tensor,
            }
        },
        like.lazy_device(),
        true,
        shape,
    )
}
