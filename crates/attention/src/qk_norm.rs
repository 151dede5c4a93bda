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

use burn::tensor::Tensor;

/// `x / √(mean(x², last axis) + epsilon)`, parameter-free. Shape kept:
/// `[batch, heads, seq, d_head]`.
pub fn rms_norm_heads(x: Tensor<4>, epsilon: f64) -> Tensor<4> {
    let rms = x.clone().square().mean_dim(3).add_scalar(epsilon).sqrt();
    x / rms
}
