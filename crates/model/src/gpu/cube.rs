//! What the GPU kernels share: launch sizes, output allocation, and the reductions over a cube
//! (one row's units) in shared memory.

use burn::tensor::Shape;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::prelude::*;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

/// `cubes` cubes, spread over the grid's axes where one axis cannot hold them; a kernel reads
/// its cube's index as `CUBE_POS` and leaves when it is `cubes` or more.
pub(super) fn cube_count(client: &Client, cubes: usize) -> CubeCount {
    calculate_cube_count_elemwise(client, cubes, CubeDim::new_1d(1))
}

/// An uninitialised tensor of `shape` on `like`'s device, in its dtype: a kernel's output.
pub(super) fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// The sum of `value` over the cube's units, `shared` holding one slot per unit (a power of
/// two of them). Every unit gets the sum; `shared` is free again when it returns.
#[cube]
pub(super) fn cube_sum<F: Float>(value: F, shared: &mut Shared<[F]>) -> F {
    cube_reduce::<F>(value, shared, false)
}

/// The largest of `value` over the cube's units, as [`cube_sum`].
#[cube]
pub(super) fn cube_max<F: Float>(value: F, shared: &mut Shared<[F]>) -> F {
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
