//! What a layer computes with, decided once, when it is built: its kernels, from its device
//! ([`Kernels`]), and the product its decode forwards multiply by ([`DecodeProduct`]).

use burn::backend::DispatchDevice;
use burn::nn::Linear;
use burn::tensor::{DType, Device, Tensor};

/// Which kernels a layer runs: Burn's tensor ops, or tinygpt's CubeCL kernels (flash attention,
/// the decode step's attention, and in the model its norms, loss and optimizer). Decided once,
/// where a layer or model is built, by [`Kernels::for_device`] (the one call in the workspace
/// that asks what a device is), and carried by what was built; a caller may choose otherwise
/// (`with_kernels`), e.g. to measure one against the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Burn's tensor ops (the CPU backends); a decoder's caches grow with the sequence and the
    /// next token is picked on the host.
    Burn,
    /// tinygpt's CubeCL kernels (a GPU through wgpu or CUDA, or a software Vulkan such as
    /// lavapipe) for f32 tensors; a decoder's caches have a fixed capacity, so every token runs
    /// the same kernels, and tokens are picked on the device.
    Cube,
}

impl Kernels {
    /// The kernels for a layer or model on `device`: [`Kernels::Cube`] on one of Burn's CubeCL
    /// devices (or the autodiff form of one), where custom kernels can run; else
    /// [`Kernels::Burn`].
    pub fn for_device(device: &Device) -> Self {
        match device.clone().inner().as_dispatch() {
            DispatchDevice::Cube(_) => Self::Cube,
            _ => Self::Burn,
        }
    }

    /// Whether tinygpt's kernels run for tensors of `dtype`: with [`Kernels::Cube`], f32 ones
    /// (mixed precision keeps the norms, the loss and the attention's softmax in f32).
    pub fn fuse(self, dtype: DType) -> bool {
        match self {
            Self::Cube => dtype == DType::F32,
            Self::Burn => false,
        }
    }
}

/// How the decode forwards multiply a step's rows (a token a sequence, or a prompt's chunk) by
/// the layer's projections: `x W + b` for `x` `[rows, new, d_in]`. Burn's matmul
/// ([`burn_product`]) unless a model brings a kernel made for a few rows on a GPU
/// (`tinygpt-model`'s rows kernel), with
/// [`CausalSelfAttention::with_decode_product`](crate::CausalSelfAttention::with_decode_product):
/// chosen where the model is built, not per call.
pub type DecodeProduct = fn(&Linear, Tensor<3>) -> Tensor<3>;

/// Burn's `Linear::forward`: the [`DecodeProduct`] a layer starts with.
pub fn burn_product(layer: &Linear, x: Tensor<3>) -> Tensor<3> {
    layer.forward(x)
}
