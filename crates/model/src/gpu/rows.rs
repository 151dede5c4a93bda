//! # Decoding's products: a few rows times a weight matrix, in one kernel
//!
//! A decode step multiplies one token's activations (a row, or a handful of rows) by every
//! weight matrix: `y = x W + b`, `x` `[rows, K]`, `W` `[K, N]`. That is a matrix-vector product,
//! whose cost is reading `W` once; a general matrix-multiply kernel, tiled for large `rows`,
//! spends most of its time on tiles that hold one useful row. Here each unit owns an output
//! column `j` and a slice of `K`, keeps one running sum per row, and the cube adds the slices:
//!
//! ```text
//! cube (32 columns × 8 slices of K):  unit (c, s) sums x[r, k]·W[k, j] for k = s, s+8, …  (each row r)
//!                                     slice 0 adds the 8 partial sums, and b[j]
//! ```
//!
//! Consecutive units read consecutive columns of `W`'s row `k` (one memory transaction per 32
//! of them), and every weight is read once for all rows. Used where it pays: a model running
//! [`Kernels::Cube`](super::Kernels::Cube) with its rows kernel on (decided where the model is
//! built, [`Gpt::with_kernels`](crate::Gpt::with_kernels)), for inputs it [`takes`]: f32 (bf16
//! and f16 too, summed in f32), at most [`MAX_ROWS`] rows, outside autodiff; everything else
//! takes Burn's matmul.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::nn::Linear;
use burn::tensor::{DType, Shape, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use cubecl::{CubeCount, CubeDim};

/// The most rows the kernel takes (a running sum each per unit).
pub const MAX_ROWS: usize = 4;
/// Output columns per cube.
const COLUMNS: usize = 32;
/// Slices of `K` per cube.
const SLICES: usize = 8;

/// `x W + b` as a backend operation: `x` `[rows, K]` (`rows <= MAX_ROWS`), `W` `[K, N]` (any
/// strides), `b` `[N]` -> `[rows, N]`. Inference only (no autodiff).
#[backend_extension(Cube, Fusion)]
pub trait RowsLinearBackend: Backend {
    #[fusion(shape = out_shape(x, weight), dtype = x)]
    fn rows_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
    ) -> FloatTensor<Self>;
}

fn out_shape(x: &Shape, weight: &Shape) -> Shape {
    Shape::new([x[0], weight[1]])
}

/// `layer`'s `x W + b` for `x` `[.., K]` on a CubeCL device: by the rows kernel where it
/// [`takes`] `x`, else by `layer.forward`. A model's layers multiply this way when it runs the
/// rows kernel (the attention's decode forwards take it as their
/// [`DecodeProduct`](tinygpt_attention::DecodeProduct)).
pub fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    let bias = layer.bias.as_ref().map(|b| b.val());
    match takes(&x) {
        true => product(x, layer.weight.val(), bias),
        false => layer.forward(x),
    }
}

/// Whether the kernel takes `x` `[.., K]`: a float (f32, or bf16/f16 summed in f32), at most
/// [`MAX_ROWS`] rows, gradients not tracked (it has no backward). On a CubeCL device: where a
/// model runs is decided where it is built, not here.
pub fn takes<const D: usize>(x: &Tensor<D>) -> bool {
    let dims = x.dims();
    let rows: usize = dims[..D - 1].iter().product();
    rows <= MAX_ROWS
        && matches!(x.dtype(), DType::F32 | DType::BF16 | DType::F16)
        && !x.device().is_autodiff()
}

/// `x W (+ b)` by the kernel, for `x` `[.., K]` on a CubeCL device where it [`takes`] it, and
/// `W` `[K, N]` (a transposed view too: the tied LM head's `wteᵀ`).
pub fn product<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
) -> Tensor<D> {
    let mut dims = x.dims();
    let [k, n] = weight.dims();
    let rows = dims[..D - 1].iter().product();
    // Without a bias the kernel is told so and reads none: any tensor holds the place.
    let (bias, has_bias) = match bias {
        Some(bias) => (bias.into_dispatch(), true),
        None => (weight.clone().into_dispatch(), false),
    };
    let y = Dispatch::rows_linear(
        x.reshape([rows, k]).into_dispatch(),
        weight.into_dispatch(),
        bias,
        has_bias,
    );
    dims[D - 1] = n;
    Tensor::<2>::from_dispatch(y).reshape(dims)
}

impl RowsLinearBackend for CubeBackend {
    fn rows_linear(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
    ) -> FloatTensor<Self> {
        let ([rows, _], [_, n]) = (x.shape().dims::<2>(), weight.shape().dims::<2>());
        // Row-major without padding, as the callers reshape it: a plain empty tensor may get
        // rows padded to an aligned pitch (CUDA does), which the kernel's indexing by strides
        // would honour but a caller's reshape then copies.
        let out = empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::new([rows, n]),
            x.dtype,
        );
        let client = x.client.clone();
        let dtype = dtype_to_storage_type(x.dtype);
        kernel::rows_linear_kernel::launch(
            &client,
            CubeCount::Static(n.div_ceil(COLUMNS) as u32, 1, 1),
            CubeDim::new_2d(COLUMNS as u32, SLICES as u32),
            x.into_tensor_arg(),
            weight.into_tensor_arg(),
            bias.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            has_bias,
            dtype,
        );
        out
    }
}

mod kernel {
    use cubecl::prelude::*;

    use super::{COLUMNS, SLICES};

    /// `out = x W (+ b)`: `x` `[rows, K]`, `W` `[K, N]`, `b` `[N]` (read only `has_bias`),
    /// `out` `[rows, N]`, each read and written by its strides (a row may be padded to an
    /// aligned pitch: CUDA pads, and a kernel that assumed `r * K` read other rows there).
    #[cube(launch)]
    pub(super) fn rows_linear_kernel<F: Float>(
        x: &Tensor<F>,
        weight: &Tensor<F>,
        bias: &Tensor<F>,
        out: &mut Tensor<F>,
        #[comptime] rows: usize,
        #[comptime] has_bias: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let (k_len, n) = (weight.shape(0), weight.shape(1));
        let (k_stride, n_stride) = (weight.stride(0), weight.stride(1));
        let (x_row, x_col) = (x.stride(0), x.stride(1));
        let column = UNIT_POS_X as usize;
        let slice = UNIT_POS_Y as usize;
        let j = CUBE_POS_X as usize * COLUMNS + column;
        // The sums in f32 whatever `F` is: a bf16 or f16 running sum over hundreds of products
        // would lose the low bits of each (PyTorch's half matmuls accumulate in f32 too).
        let mut sums = Array::<f32>::new(rows);
        #[unroll]
        for r in 0..rows {
            sums[r] = 0.0;
        }
        if j < n {
            let mut k = slice;
            while k < k_len {
                let w = weight[k * k_stride + j * n_stride];
                #[unroll]
                for r in 0..rows {
                    sums[r] += f32::cast_from(x[r * x_row + k * x_col]) * f32::cast_from(w);
                }
                k += SLICES;
            }
        }
        let mut partial = Shared::<[f32]>::new_slice(SLICES * rows * COLUMNS);
        #[unroll]
        for r in 0..rows {
            partial[(slice * rows + r) * COLUMNS + column] = sums[r];
        }
        sync_cube();
        if slice == 0 && j < n {
            let (out_row, out_col) = (out.stride(0), out.stride(1));
            #[unroll]
            for r in 0..rows {
                let mut sum = 0.0f32;
                if has_bias {
                    sum = f32::cast_from(bias[j * bias.stride(0)]);
                }
                for s in 0..SLICES {
                    sum += partial[(s * rows + r) * COLUMNS + column];
                }
                out[r * out_row + j * out_col] = F::cast_from(sum);
            }
        }
    }
}
