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
mod cube;
mod layer_norm;

use std::sync::OnceLock;

use burn::tensor::{DType, Device};

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
