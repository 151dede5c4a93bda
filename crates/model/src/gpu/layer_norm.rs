//! LayerNorm and RMSNorm in one kernel launch forward and three backward (dx; then dγ and dβ by
//! chunks of rows, then the chunks summed), instead of Burn's composed ops.
//!
//! Burn's `layer_norm` is eight tensor ops (two mean reductions, centring, square, square
//! root, division, scale, shift), each a launch, and autodiff differentiates them one by one;
//! the backward writes and reads several `[rows, C]` intermediates. Here:
//!
//! - forward: one cube per row reduces the mean, then the variance of the centred row (two
//!   passes over the row, which stays in cache), and writes `y = x̂·γ + β` with
//!   `x̂ = (x - μ)·rstd`, `rstd = 1/√(var + ε)`; it also writes `μ` and `rstd` per row for the
//!   backward, so nothing else is saved;
//! - backward, row kernel: `dx = rstd · (g - mean(g) - x̂ · mean(g · x̂))` with `g = dy · γ`,
//!   the two means reduced per row;
//! - backward, parameter kernels: `dγ = Σ_rows dy · x̂` and `dβ = Σ_rows dy`, summed over chunks
//!   of rows in parallel, then the chunks summed.
//!
//! The variance is biased (divided by `C`), as Burn's and PyTorch's.
//!
//! RMSNorm is the same kernels uncentred (a comptime flag): `μ` is 0, so `rstd =
//! 1/√(mean(x²) + ε)`, and the row gradient loses its `mean(g)` term, `dx = rstd · (g - x̂ ·
//! mean(g·x̂))`; the parameter kernels are unchanged (dβ is computed and dropped).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Backend, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::cube::{cube_count, empty_like};

/// Units per cube of the row kernels (a power of two: the reduction halves it).
const THREADS: usize = 128;
/// Rows each unit of the parameter kernel sums.
const CHUNK: usize = 64;

/// LayerNorm (`centred`) or RMSNorm as a backend operation: rows `x` `[rows, C]`, gain `γ` and
/// shift `β` `[C]`.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait LayerNormBackend: Backend {
    /// `(y, μ, rstd)`: the normalised rows `[rows, C]` and each row's mean (0 uncentred) and
    /// `1/√(var + ε)` `[rows]`.
    #[fusion(meta = |x, _gamma, _beta, _epsilon, _centred| (x.clone(), rows_spec(x), rows_spec(x)))]
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `(dx, dγ, dβ)` for the output gradient `dy`, from the forward's `x`, `μ` and `rstd`.
    #[fusion(meta = |_dy, x, gamma, _mean, _rstd, _centred| (x.clone(), gamma.clone(), gamma.clone()))]
    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// `[rows, C]` -> `[rows]`.
fn rows_spec(x: &TensorSpec) -> TensorSpec {
    TensorSpec::new(Shape::new([x.shape[0]]), x.dtype)
}

/// LayerNorm of `x` `[.., C]` over its last axis with gain `gamma` and shift `beta` (`[C]`
/// each; `None` = no shift), by the fused kernels; differentiable. `x` must be on a CubeCL
/// device (a model running [`Kernels::Cube`](super::Kernels::Cube)).
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    epsilon: f64,
) -> Tensor<D> {
    let dims = x.dims();
    let channels = dims[D - 1];
    let rows = dims[..D - 1].iter().product();
    let beta = beta.unwrap_or_else(|| Tensor::zeros([channels], &gamma.device()));
    let (y, _, _) = Dispatch::layer_norm_forward(
        x.reshape([rows, channels]).into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        epsilon as f32,
        true,
    );
    Tensor::<2>::from_dispatch(y).reshape(dims)
}

/// RMSNorm of `x` `[.., C]` over its last axis, `x / √(mean(x²) + ε) · γ` (`γ` `[C]`; `None` =
/// no gain), by the same kernels uncentred; differentiable. `x` must be on a CubeCL device
/// (a model running [`Kernels::Cube`](super::Kernels::Cube)).
pub fn rms_norm<const D: usize>(x: Tensor<D>, gamma: Option<Tensor<1>>, epsilon: f64) -> Tensor<D> {
    let dims = x.dims();
    let channels = dims[D - 1];
    let rows = dims[..D - 1].iter().product();
    let device = x.device();
    let gamma = gamma.unwrap_or_else(|| Tensor::ones([channels], &device));
    let (y, _, _) = Dispatch::layer_norm_forward(
        x.reshape([rows, channels]).into_dispatch(),
        gamma.into_dispatch(),
        Tensor::<1>::zeros([channels], &device).into_dispatch(),
        epsilon as f32,
        false,
    );
    Tensor::<2>::from_dispatch(y).reshape(dims)
}

/// What the kernels return, called directly (for tests).
#[doc(hidden)]
pub struct LayerNormParts {
    pub y: Tensor<2>,
    pub mean: Tensor<1>,
    pub rstd: Tensor<1>,
    pub dx: Tensor<2>,
    pub d_gamma: Tensor<1>,
    pub d_beta: Tensor<1>,
}

/// The forward `(y, μ, rstd)` and the backward `(dx, dγ, dβ)` for `dy`, called directly
/// (RMSNorm's with `centred` false). `x`, `dy`: `[rows, C]`.
#[doc(hidden)]
pub fn layer_norm_parts(
    x: Tensor<2>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    dy: Tensor<2>,
    epsilon: f64,
    centred: bool,
) -> LayerNormParts {
    let (y, mean, rstd) = Dispatch::layer_norm_forward(
        x.clone().into_dispatch(),
        gamma.clone().into_dispatch(),
        beta.into_dispatch(),
        epsilon as f32,
        centred,
    );
    let mean = Tensor::<1>::from_dispatch(mean);
    let rstd = Tensor::<1>::from_dispatch(rstd);
    let (dx, d_gamma, d_beta) = Dispatch::layer_norm_backward(
        dy.into_dispatch(),
        x.into_dispatch(),
        gamma.into_dispatch(),
        mean.clone().into_dispatch(),
        rstd.clone().into_dispatch(),
        centred,
    );
    LayerNormParts {
        y: Tensor::from_dispatch(y),
        mean,
        rstd,
        dx: Tensor::from_dispatch(dx),
        d_gamma: Tensor::from_dispatch(d_gamma),
        d_beta: Tensor::from_dispatch(d_beta),
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels, forward and backward side by side.

mod kernels {
    use cubecl::prelude::*;

    use crate::gpu::cube::cube_sum;

    /// Forward: one cube per row of `x` `[rows, C]`.
    #[cube(launch)]
    pub(super) fn layer_norm_forward_kernel<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        y: &mut Tensor<F>,
        mean: &mut Tensor<F>,
        rstd: &mut Tensor<F>,
        epsilon: f32,
        #[comptime] threads: usize,
        #[comptime] centred: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let (rows, channels) = (x.shape(0), x.shape(1));
        let row = CUBE_POS;
        if row >= rows {
            terminate!();
        }
        let unit = UNIT_POS_X as usize;
        let base = row * channels;
        let mut shared = Shared::<[F]>::new_slice(threads);
        let n = F::cast_from(channels);

        let mut mu = F::new(0.0);
        let mut c = unit;
        if centred {
            let mut sum = F::new(0.0);
            while c < channels {
                sum += x[base + c];
                c += threads;
            }
            mu = cube_sum::<F>(sum, &mut shared) / n;
        }

        let mut squares = F::new(0.0);
        c = unit;
        while c < channels {
            let d = x[base + c] - mu;
            squares += d * d;
            c += threads;
        }
        let var = cube_sum::<F>(squares, &mut shared) / n;
        let r = F::new(1.0) / F::sqrt(var + F::cast_from(epsilon));

        c = unit;
        while c < channels {
            y[base + c] = (x[base + c] - mu) * r * gamma[c] + beta[c];
            c += threads;
        }
        if unit == 0 {
            mean[row] = mu;
            rstd[row] = r;
        }
    }

    /// Backward, rows: `dx = rstd · (g - mean(g) - x̂ · mean(g·x̂))`, `g = dy·γ` (uncentred,
    /// without `mean(g)`); one cube per row.
    #[cube(launch)]
    pub(super) fn layer_norm_backward_rows_kernel<F: Float>(
        dy: &Tensor<F>,
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        mean: &Tensor<F>,
        rstd: &Tensor<F>,
        dx: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[comptime] centred: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let (rows, channels) = (x.shape(0), x.shape(1));
        let row = CUBE_POS;
        if row >= rows {
            terminate!();
        }
        let unit = UNIT_POS_X as usize;
        let base = row * channels;
        let mut shared = Shared::<[F]>::new_slice(threads);
        let (mu, r) = (mean[row], rstd[row]);
        let n = F::cast_from(channels);

        let mut sum_g = F::new(0.0);
        let mut sum_gx = F::new(0.0);
        let mut c = unit;
        while c < channels {
            let g = dy[base + c] * gamma[c];
            sum_g += g;
            sum_gx += g * (x[base + c] - mu) * r;
            c += threads;
        }
        // Uncentred (RMSNorm), the term is absent: no reduction for it.
        let mut mean_g = F::new(0.0);
        if centred {
            mean_g = cube_sum::<F>(sum_g, &mut shared) / n;
        }
        let mean_gx = cube_sum::<F>(sum_gx, &mut shared) / n;

        c = unit;
        while c < channels {
            let g = dy[base + c] * gamma[c];
            let x_hat = (x[base + c] - mu) * r;
            dx[base + c] = r * (g - mean_g - x_hat * mean_gx);
            c += threads;
        }
    }

    /// Backward, parameters: each unit sums `dy·x̂` and `dy` of one channel over `chunk` rows,
    /// into `partial` `[2, chunks, C]` (dγ's partial sums, then dβ's).
    #[cube(launch)]
    pub(super) fn layer_norm_backward_params_kernel<F: Float>(
        dy: &Tensor<F>,
        x: &Tensor<F>,
        mean: &Tensor<F>,
        rstd: &Tensor<F>,
        partial: &mut Tensor<F>,
        chunks: usize,
        chunk: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let (rows, channels) = (x.shape(0), x.shape(1));
        let position = ABSOLUTE_POS;
        if position >= chunks * channels {
            terminate!();
        }
        let (k, c) = (position / channels, position % channels);
        let mut d_gamma = F::new(0.0);
        let mut d_beta = F::new(0.0);
        let mut end = (k + 1) * chunk;
        if end > rows {
            end = rows;
        }
        for row in k * chunk..end {
            let d = dy[row * channels + c];
            d_gamma += d * (x[row * channels + c] - mean[row]) * rstd[row];
            d_beta += d;
        }
        partial[position] = d_gamma;
        partial[chunks * channels + position] = d_beta;
    }

    /// Sums `partial` `[2, chunks, C]` over its chunks into `d_gamma` and `d_beta` `[C]`.
    #[cube(launch)]
    pub(super) fn layer_norm_sum_chunks_kernel<F: Float>(
        partial: &Tensor<F>,
        d_gamma: &mut Tensor<F>,
        d_beta: &mut Tensor<F>,
        chunks: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let channels = d_gamma.shape(0);
        let c = ABSOLUTE_POS;
        if c >= channels {
            terminate!();
        }
        let mut g = F::new(0.0);
        let mut b = F::new(0.0);
        for k in 0..chunks {
            g += partial[k * channels + c];
            b += partial[(chunks + k) * channels + c];
        }
        d_gamma[c] = g;
        d_beta[c] = b;
    }
}

// ---------------------------------------------------------------------------------------------
// Launches on Burn's CubeCL backend.

impl LayerNormBackend for CubeBackend {
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (x, gamma, beta) = (
            into_contiguous(x),
            into_contiguous(gamma),
            into_contiguous(beta),
        );
        let rows = x.shape()[0];
        let (y, mean, rstd) = (
            empty_like(&x, x.shape()),
            empty_like(&x, Shape::new([rows])),
            empty_like(&x, Shape::new([rows])),
        );
        let client = x.client.clone();
        let dtype = dtype_to_storage_type(x.dtype);
        kernels::layer_norm_forward_kernel::launch(
            &client,
            cube_count(&client, rows),
            CubeDim::new_1d(THREADS as u32),
            x.into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            y.clone().into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            epsilon,
            THREADS,
            centred,
            dtype,
        );
        (y, mean, rstd)
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dy, x, gamma) = (
            into_contiguous(dy),
            into_contiguous(x),
            into_contiguous(gamma),
        );
        let (mean, rstd) = (into_contiguous(mean), into_contiguous(rstd));
        let [rows, channels] = x.shape().dims::<2>();
        let client = x.client.clone();
        let dtype = dtype_to_storage_type(x.dtype);
        let dx = empty_like(&x, x.shape());
        kernels::layer_norm_backward_rows_kernel::launch(
            &client,
            cube_count(&client, rows),
            CubeDim::new_1d(THREADS as u32),
            dy.clone().into_tensor_arg(),
            x.clone().into_tensor_arg(),
            gamma.into_tensor_arg(),
            mean.clone().into_tensor_arg(),
            rstd.clone().into_tensor_arg(),
            dx.clone().into_tensor_arg(),
            THREADS,
            centred,
            dtype,
        );
        let chunks = rows.div_ceil(CHUNK);
        let partial = empty_like(&x, Shape::new([2, chunks, channels]));
        let dim = CubeDim::new_1d(THREADS as u32);
        kernels::layer_norm_backward_params_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, chunks * channels, dim),
            dim,
            dy.into_tensor_arg(),
            x.clone().into_tensor_arg(),
            mean.into_tensor_arg(),
            rstd.into_tensor_arg(),
            partial.clone().into_tensor_arg(),
            chunks,
            CHUNK,
            dtype,
        );
        let (d_gamma, d_beta) = (
            empty_like(&x, Shape::new([channels])),
            empty_like(&x, Shape::new([channels])),
        );
        kernels::layer_norm_sum_chunks_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, channels, dim),
            dim,
            partial.into_tensor_arg(),
            d_gamma.clone().into_tensor_arg(),
            d_beta.clone().into_tensor_arg(),
            chunks,
            dtype,
        );
        (dx, d_gamma, d_beta)
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: the backward kernels instead of differentiating the forward op by op.

/// Whether the forward centred the rows (LayerNorm) or not (RMSNorm).
#[derive(Debug)]
struct LayerNormBackward {
    centred: bool,
}

/// `x`, `γ`, `μ`, `rstd` of the forward, on the inner backend.
type Saved<B> = [FloatTensor<B>; 4];

impl<B: LayerNormBackend> Backward<B, 3> for LayerNormBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x, gamma, mean, rstd] = ops.state;
        let dy = grads.consume::<B>(&ops.node);
        let (dx, d_gamma, d_beta) = B::layer_norm_backward(dy, x, gamma, mean, rstd, self.centred);
        for (parent, grad) in ops.parents.into_iter().zip([dx, d_gamma, d_beta]) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

impl<B: LayerNormBackend, C: CheckpointStrategy> LayerNormBackend for Autodiff<B, C> {
    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        epsilon: f32,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (x, x_node) = x.into_parts();
        let (gamma, gamma_node) = gamma.into_parts();
        let (beta, beta_node) = beta.into_parts();
        // μ and rstd are two floats a row: keep them rather than recompute the reductions.
        match (LayerNormBackward { centred })
            .prepare::<C>([x_node, gamma_node, beta_node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (y, mean, rstd) =
                    B::layer_norm_forward(x.clone(), gamma.clone(), beta, epsilon, centred);
                let state = [x, gamma, mean.clone(), rstd.clone()];
                (
                    prep.finish(state, y),
                    Self::from_inner(mean),
                    Self::from_inner(rstd),
                )
            }
            OpsKind::UnTracked(prep) => {
                let (y, mean, rstd) = B::layer_norm_forward(x, gamma, beta, epsilon, centred);
                (
                    prep.finish(y),
                    Self::from_inner(mean),
                    Self::from_inner(rstd),
                )
            }
        }
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
        centred: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Called directly (not through `backward`), the gradients are plain values.
        let (dx, d_gamma, d_beta) = B::layer_norm_backward(
            dy.into_primitive(),
            x.into_primitive(),
            gamma.into_primitive(),
            mean.into_primitive(),
            rstd.into_primitive(),
            centred,
        );
        (
            Self::from_inner(dx),
            Self::from_inner(d_gamma),
            Self::from_inner(d_beta),
        )
    }
}
