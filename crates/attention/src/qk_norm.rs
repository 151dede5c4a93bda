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
/// d_head]` (groups q | k | v, see [`QueryAndKeyHeads`]): the query and key groups normalised,
/// the values as they are. The flash kernels then read all three where the projection wrote
/// them, and the gradient comes back as one tensor of that shape instead of three slices
/// assigned into zeros.
pub fn rms_norm_packed(qkv: Tensor<4>, heads: &QueryAndKeyHeads, epsilon: f64) -> Tensor<4> {
    // A value head's divisor is `rms·0 + 1`, exactly 1; its RMS is capped first so that one
    // whose square overflowed (`∞·0`) cannot make it NaN.
    let rms = qkv.clone().square().mean_dim(3).add_scalar(epsilon).sqrt();
    qkv / (rms.clamp_max(f32::MAX) * heads.keep.clone() + heads.other.clone())
}

/// Which groups of the projection's packed layout (its `d_head`-wide column groups: the query
/// heads, then the key heads, then the value heads) are queries and keys: made once per layer
/// call and read by both [`rms_norm_packed`] and
/// [`RopeRows::apply_packed`](crate::rope::RopeRows::apply_packed).
#[derive(Debug, Clone)]
pub struct QueryAndKeyHeads {
    /// `[1, 1, groups, 1]`: 1 for the query and key heads, 0 for the value heads.
    pub(crate) keep: Tensor<4>,
    /// `[1, 1, groups, 1]`: the other way round.
    pub(crate) other: Tensor<4>,
}

impl QueryAndKeyHeads {
    /// The first `qk_heads` of `groups` are queries and keys. Factors rather than a boolean
    /// mask: with a mask the training step launched more kernels (Burn's fusion leaves its
    /// `mask_fill` to a kernel of its own).
    pub fn new(groups: usize, qk_heads: usize, device: &Device) -> Self {
        let keep: Vec<f32> = (0..groups)
            .map(|g| f32::from(u8::from(g < qk_heads)))
            .collect();
        let other: Vec<f32> = keep.iter().map(|k| 1.0 - k).collect();
        let factors =
            |values| Tensor::from_data(TensorData::new(values, [1, 1, groups, 1]), device);
        Self {
            keep: factors(keep),
            other: factors(other),
        }
    }
}
