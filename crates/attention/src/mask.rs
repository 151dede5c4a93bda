//! Causal masks and the two ways to apply them to attention scores.
//!
//! Self-attention lets every position look at every other one. A language model predicts token
//! `i + 1` from tokens `0..=i`, and it is trained on all positions of a sequence at once, so the
//! answer for position `i` sits in the input at position `i + 1`. Without a mask the model would
//! simply copy it. The causal mask hides every key `j > i` from query `i`.
//!
//! The mask must act on the *scores* before the softmax, or on the *weights* followed by a
//! renormalisation; both give the same weights (proved in this crate's tests):
//!
//! - [`mask_then_softmax`]: fill the hidden scores with [`MASKED_SCORE`] and take the softmax. As
//!   `exp(-1e9 - max)` is exactly `0.0` in `f32`, the hidden keys get weight 0 and the softmax's
//!   denominator only sums the visible keys.
//! - [`softmax_then_renormalise`]: take the softmax over all keys, zero the hidden weights (a
//!   multiply by the [`tril`] matrix) and divide each row by its new sum. Softmax is
//!   `exp(s_j) / Σ_all exp(s_k)`; after zeroing, the row sum is `Σ_visible exp(s_k) / Σ_all
//!   exp(s_k)`, and dividing by it cancels `Σ_all`, leaving `exp(s_j) / Σ_visible exp(s_k)`:
//!   exactly the first method's weights. It does more work and leaks nothing, but its first
//!   softmax is wasted, which is why real models use the first method.
//!
//! Why a large negative number and not `-inf` (tutorials use both)? `exp(-inf) = 0` too, but any
//! arithmetic that meets `-inf` twice is `NaN`: a row whose keys are all hidden (padding) gives
//! `-inf - (-inf)` in the softmax's max-subtraction, and backward passes multiply by the scores'
//! neighbours (`0 · inf`). In a probe under Burn's autodiff, `-inf` scores gave a `NaN` loss within
//! 30 optimisation steps. `-1e9` has the same effect on the weights and keeps every number finite.
//!
//! Decoding many sequences at once (a server's requests, one row each) meets a third mask:
//! the rows have different lengths, so their keys are stacked to the longest and each row's
//! keys past its own length are hidden ([`lengths_mask`]), exactly as padding is. A row then
//! attends to its own tokens only and gets what it would get alone.
//!
//! A common trap: `tril(scores)` followed by "fill every zero with -inf" also hides a
//! *visible* score that happens to be exactly 0. Build the mask from positions, never from values.

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Tensor, TensorData};

/// The value hidden scores are filled with before the softmax (seed: `masked_fill(mask, -1e9)`).
pub const MASKED_SCORE: f32 = -1e9;

/// The causal mask, `true` where the key is in the future of the query (`j > i`): what PyTorch
/// writes `torch.triu(torch.ones(t, t), diagonal=1).bool()`.
///
/// Shape: `[seq, seq]`.
pub fn causal_mask(seq_len: usize, device: &Device) -> Tensor<2, Bool> {
    causal_mask_with_offset(seq_len, seq_len, 0, device)
}

/// The causal mask for `queries` new tokens that follow `past` cached ones: query `i` sits at
/// position `past + i` and may see keys `0..=past + i`. `true` where `j > past + i`.
///
/// Shape: `[queries, past + queries]`.
pub fn causal_mask_with_offset(
    queries: usize,
    keys: usize,
    past: usize,
    device: &Device,
) -> Tensor<2, Bool> {
    // Burn's `tril_mask` is `false` on the lower triangle shifted right by `past` and `true`
    // elsewhere: `true` exactly where `j - i > past`.
    Tensor::<2, Bool>::tril_mask([queries, keys], past as i64, device)
}

/// The keys each row of a batch may not see when the rows hold `lengths[r]` tokens each,
/// stacked to `keys` (at least the longest): `true` where `j >= lengths[r]`, the key padding of
/// sequences of different lengths. A query that is row `r`'s newest token sees all its row's
/// keys, so no causal part is needed.
///
/// Shape: `[lengths.len(), keys]`.
pub fn lengths_mask(lengths: &[usize], keys: usize, device: &Device) -> Tensor<2, Bool> {
    let hidden: Vec<bool> = lengths
        .iter()
        .flat_map(|&len| (0..keys).map(move |j| j >= len))
        .collect();
    Tensor::from_data(TensorData::new(hidden, [lengths.len(), keys]), device)
}

/// `torch.tril(torch.ones(t, t))`: ones on and below the diagonal, zeros above; the weights a
/// query may keep. Multiplying weights by it zeroes the future.
///
/// Shape: `[seq, seq]`.
pub fn tril(seq_len: usize, device: &Device) -> Tensor<2> {
    Tensor::<2>::ones([seq_len, seq_len], device).tril(0)
}

/// `torch.triu(torch.ones(t, t), diagonal)`: ones where `j - i >= diagonal`, zeros elsewhere.
/// With `diagonal = 1` it marks the future: the float form of [`causal_mask`].
///
/// Shape: `[seq, seq]`.
pub fn triu(seq_len: usize, diagonal: i64, device: &Device) -> Tensor<2> {
    Tensor::<2>::ones([seq_len, seq_len], device).triu(diagonal)
}

/// Method (a): fill hidden scores with [`MASKED_SCORE`], then softmax over the keys (last dim).
///
/// `scores`: `[..., queries, keys]`; `mask`: same shape, `true` = hidden. Returns weights of the
/// same shape whose rows sum to 1 over the visible keys.
pub fn mask_then_softmax<const D: usize>(scores: Tensor<D>, mask: Tensor<D, Bool>) -> Tensor<D> {
    softmax(scores.mask_fill(mask, MASKED_SCORE), D - 1)
}

/// Method (b): softmax over all keys, multiply by `keep` (1 = visible, 0 = hidden, e.g.
/// [`tril`]), divide each row by its sum.
///
/// `scores`, `keep`: `[..., queries, keys]` (`keep` broadcasts). Returns weights of the same
/// shape. Every row must keep at least one key, or it divides by zero.
pub fn softmax_then_renormalise<const D: usize>(scores: Tensor<D>, keep: Tensor<D>) -> Tensor<D> {
    let weights = softmax(scores, D - 1) * keep;
    let row_sums = weights.clone().sum_dim(D - 1);
    weights / row_sums
}
