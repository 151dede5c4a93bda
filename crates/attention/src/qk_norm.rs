//! QK-norm (Dehghani et al. 2023; OLMo 2, nanochat): each query and key vector of each head is
//! normalised to unit root-mean-square before the scores are taken.
//!
//! ```text
//! rms_norm(x) = x / √(mean(x²) + ε)        over d_head, per head, per position
//! ```
//!
//! A normalised vector has length `√d_head`, so by Cauchy–Schwarz every score `q·k / √d_head`
//! lies in `[−√d_head, √d_head]`: however large the projections grow in training, the softmax
//! cannot saturate into one-hot weights whose gradients vanish (the "attention logit growth"
//! that destabilises large learning rates). nanochat's form has no learned gain; the rotary
//! rotation ([`rope`](crate::rope)) comes after it and keeps the length.

use burn::tensor::{Device, Tensor, TensorData};

/// `x / √(mean(x², last axis) + epsilon)`, parameter-free. Shape kept:
/// `[batch, heads, seq, d_head]`.
pub fn rms_norm_heads(x: Tensor<4>, epsilon: f64) -> Tensor<4> {
    let rms = x.clone().square().mean_dim(3).add_scalar(epsilon).sqrt();
    x / rms
}

/// The same normalisation on the projection's packed heads `[batch, seq, heads + 2·kv_heads,
/// d_head]` (groups q | k | v, see [`query_and_key_heads`]): the first `qk_heads` groups
/// (queries and keys) normalised, the values as they are. The flash kernels then read all three
/// where the projection wrote them, and the gradient comes back as one tensor of that shape
/// instead of three slices assigned into zeros.
pub fn rms_norm_packed(qkv: Tensor<4>, qk_heads: usize, epsilon: f64) -> Tensor<4> {
    let groups = qkv.dims()[2];
    let (keep, other) = query_and_key_heads(groups, qk_heads, &qkv.device());
    // A value head's divisor is `rms·0 + 1`, exactly 1; its RMS is capped first so that one
    // whose square overflowed (`∞·0`) cannot make it NaN.
    let rms = qkv.clone().square().mean_dim(3).add_scalar(epsilon).sqrt();
    qkv / (rms.clamp_max(f32::MAX) * keep + other)
}

/// `[1, 1, groups, 1]` each: 1 for the query and key heads (the first `qk_heads` groups of the
/// projection's packed layout, its `d_head`-wide column groups: the query heads, then the key
/// heads, then the value heads) and 0 for the value heads; and the other way round. Factors
/// rather than a boolean mask: with a mask the training step launched more kernels (Burn's
/// fusion leaves its `mask_fill` to a kernel of its own).
pub fn query_and_key_heads(
    groups: usize,
    qk_heads: usize,
    device: &Device,
) -> (Tensor<4>, Tensor<4>) {
    let keep: Vec<f32> = (0..groups)
        .map(|g| f32::from(u8::from(g < qk_heads)))
        .collect();
    let other: Vec<f32> = keep.iter().map(|k| 1.0 - k).collect();
    let factors = |values| Tensor::from_data(TensorData::new(values, [1, 1, groups, 1]), device);
    (factors(keep), factors(other))
}
