//! The fused engine's kernels: one file per op family, forward and backward side by side, on
//! flat `f32` slices. They know nothing of models: [`super::block`] composes them into a block,
//! `train/` and `decode/` run the blocks. A kernel imports only other kernels.

pub(crate) mod attention;
pub(crate) mod blocks;
pub(crate) mod cross_entropy;
pub(crate) mod dropout;
pub(crate) mod gelu;
pub(crate) mod gelu_tanh;
pub(crate) mod k_quants;
pub(crate) mod layer_norm;
pub(crate) mod lora;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod prefetch;
pub(crate) mod prefill;
pub(crate) mod q4_0;
pub(crate) mod q5_0;
pub mod q8;
pub(crate) mod qk_norm;
pub(crate) mod quads;
pub(crate) mod relu2;
pub(crate) mod rms_norm;
pub(crate) mod rope;
pub(crate) mod rows;
pub(crate) mod softcap;
pub(crate) mod swiglu;
