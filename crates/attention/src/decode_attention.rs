//! # A decode step's attention in one kernel
//!
//! In a decode step each query (one token a row, or a prompt's chunk) attends to a fixed cache
//! of `capacity` keys, the keys past its position hidden. Written as tensor ops that is a
//! matmul for the scores, the mask, the softmax's reductions and exponentials, and a matmul
//! for the weighted sum: six or seven launches a layer, each a general kernel sized for large
//! matrices doing a vector's work. Here one cube per query does all of it:
//!
//! ```text
//! cube (row r, head h, query i), p = position[r, i]:
//!   units j = u, u+U, …  ≤ p:   s_j = (q · k_j) / √d_head              (shared memory)
//!   the cube:                   m = max_j s_j;  w_j = exp(s_j − m);  l = Σ_j w_j
//!                               (each unit over its keys, then over the units' partials)
//!   units c = u, u+U, … < d:    out[r, i, h, c] = Σ_j w_j · v_j[c] / l
//! ```
//!
//! The keys a query may see are those at or before its position, as the step's mask says
//! (`hidden[r, i, j] = j > position[r, i]`); grouped heads read their key/value head
//! (`h / (heads / kv_heads)`) in place. Products and sums are in f32 whatever the tensors'
//! dtype. The output is written with the heads already side by side (`[rows, new, heads ·
//! d_head]`), what the output projection reads. Used where it applies ([`applies`]: a layer
//! stack running [`Kernels::Cube`], outside autodiff), decided once per decoder when its step's
//! tables are made ([`StepTables::new`](crate::StepTables::new)); a decoder made with
//! [`Kernels::Burn`] tables attends with tensor ops instead, to measure one against the other.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{Shape, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::{CubeCount, CubeDim};

use crate::kernels::Kernels;

/// Units per cube.
const UNITS: usize = 64;
/// The longest cache the kernel takes: its scores live in the cube's shared memory, 4 bytes a
/// key, and WebGPU promises 16 KiB of it (CUDA 48).
pub const MAX_CAPACITY: usize = 4096;

/// A decode step's attention as a backend operation: `q` `[rows, heads, new, d_head]`, `k` and
/// `v` `[rows, kv_heads, capacity, d_head]` (any strides), `positions` `[rows, new]` (f32,
/// exact below 2^24) -> `[rows, new, heads · d_head]`. Inference only (no autodiff).
#[backend_extension(Cube, Fusion)]
pub trait DecodeAttentionBackend: Backend {
    #[fusion(shape = out_shape(q), dtype = q)]
    fn decode_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

fn out_shape(q: &Shape) -> Shape {
    Shape::new([q[0], q[2], q[1] * q[3]])
}

/// Whether the kernel runs for steps of layers running `kernels` over caches of `capacity`
/// keys: [`Kernels::Cube`], and a cache whose scores fit shared memory. (Outside autodiff too:
/// the kernel has no backward; [`StepTables::new`](crate::StepTables::new) checks that.)
pub fn applies(kernels: Kernels, capacity: usize) -> bool {
    kernels == Kernels::Cube && capacity <= MAX_CAPACITY
}

/// `softmax(q kᵀ/√d_head, keys past each query's position hidden) v`, the heads side by side:
/// `[rows, new, heads · d_head]`. `positions` `[rows, new]` in f32.
pub fn decode_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    positions: Tensor<2>,
) -> Tensor<3> {
    let y = Dispatch::decode_attention(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        positions.into_dispatch(),
    );
    Tensor::<3>::from_dispatch(y)
}

impl DecodeAttentionBackend for CubeBackend {
    fn decode_attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        positions: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [rows, heads, new, d_head] = q.shape().dims::<4>();
        let [_, kv_heads, capacity, _] = k.shape().dims::<4>();
        let out = empty_device_contiguous_dtype(
            q.client.clone(),
            q.device.clone(),
            Shape::new([rows, new, heads * d_head]),
            q.dtype,
        );
        let client = q.client.clone();
        let dtype = dtype_to_storage_type(q.dtype);
        let positions_dtype = dtype_to_storage_type(positions.dtype);
        kernel::decode_attention_kernel::launch(
            &client,
            CubeCount::Static((rows * heads * new) as u32, 1, 1),
            CubeDim::new_1d(UNITS as u32),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            positions.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            heads / kv_heads,
            capacity,
            dtype,
            positions_dtype,
        );
        out
    }
}

mod kernel {
    use cubecl::prelude::*;

    use super::UNITS;

    /// See the module: cube `(r, h, i)` flattened as `(r · heads + h) · new + i`.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decode_attention_kernel<F: Float, P: Float>(
        q: &Tensor<F>,
        k: &Tensor<F>,
        v: &Tensor<F>,
        positions: &Tensor<P>,
        out: &mut Tensor<F>,
        #[comptime] group: usize,
        #[comptime] capacity: usize,
        #[define(F)] _dtype: ElemType,
        #[define(P)] _positions_dtype: ElemType,
    ) {
        let (heads, new, d_head) = (q.shape(1), q.shape(2), q.shape(3));
        let cube = CUBE_POS_X as usize;
        let (i, h, r) = (cube % new, (cube / new) % heads, cube / (new * heads));
        let kv = h / group;
        let unit = UNIT_POS_X as usize;
        let at = positions[r * positions.stride(0) + i * positions.stride(1)];
        let seen = usize::cast_from(at) + 1;
        let scale = 1.0f32 / f32::sqrt(f32::cast_from(d_head));
        let q_at = r * q.stride(0) + h * q.stride(1) + i * q.stride(2);
        let k_at = r * k.stride(0) + kv * k.stride(1);
        let v_at = r * v.stride(0) + kv * v.stride(1);
        let mut scores = Shared::<[f32]>::new_slice(capacity);
        // Each unit's share of the max and of the sum, then the cube's: a unit reads its own
        // keys' scores and the 64 partials, not every score.
        let mut partial = Shared::<[f32]>::new_slice(UNITS);
        let mut most = f32::new(-3.0e38);
        let mut j = unit;
        while j < seen {
            let mut s = 0.0f32;
            for c in 0..d_head {
                let key = k[k_at + j * k.stride(2) + c * k.stride(3)];
                s += f32::cast_from(q[q_at + c * q.stride(3)]) * f32::cast_from(key);
            }
            let s = s * scale;
            scores[j] = s;
            most = f32::max(most, s);
            j += UNITS;
        }
        partial[unit] = most;
        sync_cube();
        for u in 0..UNITS {
            most = f32::max(most, partial[u]);
        }
        sync_cube();
        let mut total = 0.0f32;
        let mut j = unit;
        while j < seen {
            let w = f32::exp(scores[j] - most);
            scores[j] = w;
            total += w;
            j += UNITS;
        }
        partial[unit] = total;
        sync_cube();
        total = 0.0;
        for u in 0..UNITS {
            total += partial[u];
        }
        let out_column = out.stride(2);
        let out_at = r * out.stride(0) + i * out.stride(1) + h * d_head * out_column;
        let mut c = unit;
        while c < d_head {
            let mut acc = 0.0f32;
            for j in 0..seen {
                acc += scores[j] * f32::cast_from(v[v_at + j * v.stride(2) + c * v.stride(3)]);
            }
            out[out_at + c * out_column] = F::cast_from(acc / total);
            c += UNITS;
        }
    }
}
