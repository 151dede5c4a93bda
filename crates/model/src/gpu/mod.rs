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
//! - [`adamw`]: AdamW over every parameter, held end to end in flat buffers, in one launch;
//! - [`embedding`]: the token embedding, its gradient a one-hot matrix product (a fixed order
//!   of sums, no atomic adds) for vocabularies up to [`ONE_HOT_VOCAB`];
//! - [`sum_all`]: a whole tensor's sum in rows of [`ROW`] (Burn's own whole-tensor reduction
//!   on wgpu stops counting past 2^18 elements), on any device;
//! - [`rows`]: decoding's products, a token's few rows times a weight matrix, in one kernel
//!   that reads each weight once for all rows.
//!
//! Which the model runs is [`Kernels`] (the attention crate's, which decides its flash and
//! decode-attention kernels by it too), decided once where a model is built, from its device
//! ([`Kernels::for_device`]), and handed down to the norms and the attention layers and read by
//! the loss, the decoders and the trainer's AdamW; the CPU backends keep Burn's ops. Each
//! kernel is tested equal to the Burn ops it replaces (forward and gradients) on lavapipe.

mod adamw;
mod cross_entropy;
mod cube;
mod embedding;
mod layer_norm;
pub mod rows;
mod sum;

use burn::tensor::Device;

pub use adamw::{AdamWBackend, AdamWBuffers, adamw};
#[doc(hidden)]
pub use cross_entropy::cross_entropy_parts;
pub use cross_entropy::{CrossEntropyBackend, cross_entropy};
pub use embedding::{EmbeddingBackend, ONE_HOT_VOCAB, embedding};
pub use layer_norm::{LayerNormBackend, layer_norm, rms_norm};
#[doc(hidden)]
pub use layer_norm::{LayerNormParts, layer_norm_parts};
pub use sum::{ROW, sum_all};
pub use tinygpt_attention::Kernels;

/// How many tensors one kernel may bind on `device`: CubeCL's `max_bindings` (on wgpu the
/// device's storage buffers per shader stage, less one; 1,024 on CUDA), which bounds what
/// Burn's fusion merges into one kernel. `None` off a CubeCL device.
pub fn max_bindings(device: &Device) -> Option<u32> {
    match device.clone().inner().as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => {
            Some(cube.client().properties().hardware.max_bindings)
        }
        _ => None,
    }
}
