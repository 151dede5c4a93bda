//! AdamW over every parameter in one launch (llm.c's `adamw_kernel`).
//!
//! The parameters, their gradients and both moments are flat `[n]` buffers holding every
//! parameter end to end; one unit updates one value. The step's scalars that live on the
//! device come in a `[3]` tensor: the gradients' scale (global-norm clipping, and f16's loss
//! scale undone), the step count `t` after this step, and whether to apply the step at all
//! (0 when the loss or the norm was not finite: every value is then written back unchanged).
//! The arithmetic is Burn's `AdamW`: `m ← β₁m + (1-β₁)g`, `v ← β₂v + (1-β₂)g²`,
//! `p ← p(1 - lr·λ·decay) - lr · m̂ / (√v̂ + ε)` with `m̂ = m/(1-β₁ᵗ)`, `v̂ = v/(1-β₂ᵗ)`.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::Tensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::cube::empty_like;
use crate::optim::AdamWSettings;

/// Units per cube.
const THREADS: u32 = 256;

/// AdamW as a backend operation on flat buffers; see the module docs.
#[backend_extension(Cube, Fusion)]
pub trait AdamWBackend: Backend {
    /// `(params, moment_1, moment_2)` after one step.
    #[fusion(meta = |params, _grads, _m1, _m2, _decay, _step, _lr, _settings| {
        (params.clone(), params.clone(), params.clone())
    })]
    #[allow(clippy::too_many_arguments)]
    fn adamw_step(
        params: FloatTensor<Self>,
        grads: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        decay: FloatTensor<Self>,
        step: FloatTensor<Self>,
        lr: f32,
        settings: [f32; 4],
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// The flat buffers of [`adamw`], `[n]` each.
pub struct AdamWBuffers {
    pub params: Tensor<1>,
    pub moment_1: Tensor<1>,
    pub moment_2: Tensor<1>,
}

/// One AdamW step of `buffers` along `grads` (`[n]`), `decay` (`[n]`: 1 where weight decay
/// applies, else 0) and `step` (`[3]`: gradient scale, step count after this step, 1 to apply
/// or 0 to keep everything), at learning rate `lr`, in one kernel on a CubeCL device.
pub fn adamw(
    buffers: AdamWBuffers,
    grads: Tensor<1>,
    decay: Tensor<1>,
    step: Tensor<1>,
    lr: f64,
    settings: &AdamWSettings,
) -> AdamWBuffers {
    let s = settings;
    let (params, moment_1, moment_2) = Dispatch::adamw_step(
        buffers.params.into_dispatch(),
        grads.into_dispatch(),
        buffers.moment_1.into_dispatch(),
        buffers.moment_2.into_dispatch(),
        decay.into_dispatch(),
        step.into_dispatch(),
        lr as f32,
        [s.beta_1, s.beta_2, s.epsilon, s.weight_decay],
    );
    AdamWBuffers {
        params: Tensor::from_dispatch(params),
        moment_1: Tensor::from_dispatch(moment_1),
        moment_2: Tensor::from_dispatch(moment_2),
    }
}

mod kernels {
    use cubecl::prelude::*;

    /// One unit per value; see the module docs.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn adamw_kernel<F: Float>(
        params: &Tensor<F>,
        grads: &Tensor<F>,
        moment_1: &Tensor<F>,
        moment_2: &Tensor<F>,
        decay: &Tensor<F>,
        step: &Tensor<F>,
        params_out: &mut Tensor<F>,
        moment_1_out: &mut Tensor<F>,
        moment_2_out: &mut Tensor<F>,
        lr: f32,
        beta_1: f32,
        beta_2: f32,
        epsilon: f32,
        weight_decay: f32,
        #[define(F)] _dtype: ElemType,
    ) {
        let i = ABSOLUTE_POS;
        if i >= params.shape(0) {
            terminate!();
        }
        let (p, m, v) = (params[i], moment_1[i], moment_2[i]);
        let one = F::new(1.0);
        if step[2] == F::new(0.0) {
            params_out[i] = p;
            moment_1_out[i] = m;
            moment_2_out[i] = v;
        } else {
            let (b1, b2) = (F::cast_from(beta_1), F::cast_from(beta_2));
            let lr = F::cast_from(lr);
            let g = grads[i] * step[0];
            let m_new = b1 * m + (one - b1) * g;
            let v_new = b2 * v + (one - b2) * g * g;
            let t = step[1];
            let m_hat = m_new / (one - F::powf(b1, t));
            let v_hat = v_new / (one - F::powf(b2, t));
            let decayed = p * (one - lr * F::cast_from(weight_decay) * decay[i]);
            params_out[i] = decayed - lr * m_hat / (F::sqrt(v_hat) + F::cast_from(epsilon));
            moment_1_out[i] = m_new;
            moment_2_out[i] = v_new;
        }
    }
}
impl AdamWBackend for CubeBackend {
    fn adamw_step(
        params: FloatTensor<Self>,
        grads: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        decay: FloatTensor<Self>,
        step: FloatTensor<Self>,
        lr: f32,
        settings: [f32; 4],
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [params, grads, moment_1, moment_2, decay, step] =
            [params, grads, moment_1, moment_2, decay, step].map(into_contiguous);
        let client = params.client.clone();
        let empty = || empty_like(&params, params.shape());
        let (params_out, moment_1_out, moment_2_out) = (empty(), empty(), empty());
        let dim = CubeDim::new_1d(THREADS);
        let [beta_1, beta_2, epsilon, weight_decay] = settings;
        let dtype = dtype_to_storage_type(params.dtype);
        kernels::adamw_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, params.shape().num_elements(), dim),
            dim,
            params.into_tensor_arg(),
            grads.into_tensor_arg(),
            moment_1.into_tensor_arg(),
            moment_2.into_tensor_arg(),
            decay.into_tensor_arg(),
            step.into_tensor_arg(),
            params_out.clone().into_tensor_arg(),
            moment_1_out.clone().into_tensor_arg(),
            moment_2_out.clone().into_tensor_arg(),
            lr,
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
            dtype,
        );
        (params_out, moment_1_out, moment_2_out)
    }
}
