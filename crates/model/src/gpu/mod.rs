//! # Fused GPU kernels for the model's memory-bound ops
//!
//! A training step on a GPU launches a kernel per Burn op unless Burn's fusion merges them,
//! and fusion stops at reductions: LayerNorm (two reductions per row) and the cross-entropy
//! (a max, a sum of exponentials and a gather per row) are each a chain of launches forward
//! and more backward, every one reading and writing whole activations. Here each is a CubeCL
//! kernel with a hand-written backward, a Burn backend extension like flash attention's:
//!
//! - [`layer_norm`] and [`rms_norm`] (the same kernels, uncentred): one launch forward, three
//!   backward (the row gradients, then the parameter sums in two);
//! - [`cross_entropy`]: the loss with `ignore_index` in one launch, the logits' gradient in
//!   one more, never materialising the softmax;
//! - [`adamw`]: AdamW over every parameter, held end to end in flat buffers, in one launch.
//!
//! The model uses the norms and the loss on CubeCL devices (wgpu, cuda) for f32 tensors
//! ([`supported`]), the trainer the third; the CPU backends keep Burn's ops. Each is tested
//! equal to the Burn ops it replaces (forward and gradients) on lavapipe.

mod adamw;
mod cross_entropy;
mod layer_norm;

use std::sync::OnceLock;

use burn::tensor::{DType, Device, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

pub use adamw::{AdamWBackend, AdamWBuffers, adamw};
#[doc(hidden)]
pub use cross_entropy::cross_entropy_parts;
pub use cross_entropy::{CrossEntropyBackend, cross_entropy};
pub use layer_norm::{LayerNormBackend, layer_norm, rms_norm};
#[doc(hidden)]
pub use layer_norm::{LayerNormParts, layer_norm_parts};

/// Whether the fused kernels run for tensors of `dtype` on `device`: a CubeCL device and f32
/// (mixed precision keeps LayerNorm and the loss in f32), unless the environment variable
/// `TINYGPT_BURN_OPS` is set, which keeps Burn's ops everywhere (to compare the two).
pub fn supported(device: &Device, dtype: DType) -> bool {
    static BURN_OPS: OnceLock<bool> = OnceLock::new();
    let burn_ops = *BURN_OPS.get_or_init(|| std::env::var_os("TINYGPT_BURN_OPS").is_some());
    !burn_ops && tinygpt_attention::flash::is_cube_device(device) && dtype == DType::F32
}

/// `cubes` cubes, spread over the grid's axes where one axis cannot hold them; a kernel reads
/// its cube's index as `CUBE_POS` and leaves when it is `cubes` or more.
fn cube_count(client: &Client, cubes: usize) -> CubeCount {
    calculate_cube_count_elemwise(client, cubes, CubeDim::new_1d(1))
}

/// An uninitialised tensor of `shape` on `like`'s device, in its dtype: a kernel's output.
fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// The sum of `value` over the cube's units, `shared` holding one slot per unit (a power of
/// two of them). Every unit gets the sum; `shared` is free again when it returns.
#[cube]
fn cube_sum<F: Float>(value: F, shared: &mut Shared<[F]>) -> F {
    cube_reduce::<F>(value, shared, false)
}

/// The largest of `value` over the cube's units, as [`cube_sum`].
#[cube]
fn cube_max<F: Float>(value: F, shared: &mut Shared<[F]>) -> F {
    cube_reduce::<F>(value, shared, true)
}

/// A tree reduction in shared memory: half the live units combine two slots each round.
#[cube]
fn cube_reduce<F: Float>(value: F, shared: &mut Shared<[F]>, #[comptime] max: bool) -> F {
    let unit = UNIT_POS_X as usize;
    shared[unit] = value;
    sync_cube();
    let mut stride = CUBE_DIM_X as usize / 2;
    while stride > 0 {
        if unit < stride {
            let (a, b) = (shared[unit], shared[unit + stride]);
            shared[unit] = if max { F::max(a, b) } else { a + b };
        }
        sync_cube();
        stride /= 2;
    }
    let total = shared[0];
    sync_cube();
    total
}
