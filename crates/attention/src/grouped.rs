//! Grouped-query attention (GQA; Ainslie et al. 2023, used by Llama 3 and nanochat): fewer
//! key/value heads than query heads.
//!
//! `n_heads` query heads share `n_kv_heads` key/value heads in groups of
//! `n_heads / n_kv_heads`: query head `h` reads key/value head `h / group`. With
//! `n_kv_heads = n_heads` it is ordinary multi-head attention; with `n_kv_heads = 1`,
//! multi-query attention (Shazeer 2019). The keys and values a model computes, and the KV cache
//! sampling keeps, shrink by the group size, at a small cost in quality.
//!
//! Two ways to compute it give the same outputs (tested):
//! - [`repeat_kv`]: copy each key/value head once per query head of its group, then run
//!   multi-head attention. Simple, and what Hugging Face's Llama does, but it materialises the
//!   copies;
//! - [`grouped_attention`]: fold each group's query heads into the query axis, so all of them
//!   score against their one shared key head in a single matmul; nothing is copied.

use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Tensor};

use crate::mask::MASKED_SCORE;

/// Each key/value head repeated `group` times, in place: `[batch, kv_heads, seq, d_head]` →
/// `[batch, kv_heads · group, seq, d_head]`, head `h` of the result being head `h / group`.
pub fn repeat_kv(x: Tensor<4>, group: usize) -> Tensor<4> {
    let [b, kv, s, d] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([b, kv, group, s, d])
        .reshape([b, kv * group, s, d])
}

/// Causal attention of `q` `[batch, heads, seq, d_head]` over `k`, `v`
/// `[batch, kv_heads, keys, d_head]` (`kv_heads` dividing `heads`), `hidden` `[seq, keys]`
/// (`true` = hidden, e.g. [`causal_mask`](crate::mask::causal_mask)). Returns
/// `[batch, heads, seq, d_head]`.
///
/// Query heads `g·group .. (g+1)·group` are consecutive, so `[batch, heads, seq, d]` reshapes to
/// `[batch, kv_heads, group·seq, d]` without moving anything: row `j·seq + i` of group `g` is
/// query `i` of head `g·group + j`, and the mask's rows repeat once per head of the group.
pub fn grouped_attention(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    hidden: Tensor<2, Bool>,
) -> Tensor<4> {
    let [b, heads, seq, d] = q.dims();
    let [_, kv_heads, keys, _] = k.dims();
    let group = heads / kv_heads;
    let q = q.reshape([b, kv_heads, group * seq, d]);
    let scores = q.matmul(k.swap_dims(2, 3)) / (d as f64).sqrt();
    let hidden = hidden
        .repeat_dim(0, group)
        .reshape([1, 1, group * seq, keys]);
    let weights = softmax(scores.mask_fill(hidden, MASKED_SCORE), 3);
    weights.matmul(v).reshape([b, heads, seq, d])
}
