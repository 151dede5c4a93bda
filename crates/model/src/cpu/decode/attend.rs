//! A decoding step's attention over the KV cache: a whole window from position 0, a prompt's
//! chunk after cached rows, and rows (a sampled token) after the cache, the last with its heads
//! split over the decoding threads once the cache is long.

use crate::cpu::block::Heads;
use crate::cpu::dims::Dims;
use crate::cpu::kernels::attention::{self, Shape, causal_softmax};
use crate::cpu::kernels::matmul::{View, dot_lanes, matmul_into};
use crate::cpu::spin_pool::{Helpers, split_heads};
use crate::fast_math::{self, vectorized};

/// One block's KV cache (`[block_size, kv_width]` keys and values), and how many of its rows
/// were filled before the rows being fed.
pub(super) struct Cache<'a> {
    pub(super) keys: &'a mut [f32],
    pub(super) values: &'a mut [f32],
    pub(super) past: usize,
    pub(super) dims: &'a Dims,
}

impl Cache<'_> {
    /// Appends the keys and values of `qkv`'s rows (`[rows, qkv_width]`) after the cached ones.
    pub(super) fn append(&mut self, qkv: &[f32]) {
        let (c, kv) = (self.dims.width, self.dims.kv_width());
        for (r, qkv) in qkv.chunks_exact(self.dims.qkv_width()).enumerate() {
            let at = (self.past + r) * kv..(self.past + r + 1) * kv;
            self.keys[at.clone()].copy_from_slice(&qkv[c..c + kv]);
            self.values[at].copy_from_slice(&qkv[c + kv..]);
        }
    }
}

/// A whole window from position 0: the training step's blocked causal attention; its keys and
/// values are cached.
pub(super) fn attend_window(h: Heads<'_>, mut cache: Cache<'_>) {
    cache.append(h.qkv);
    let d = cache.dims;
    let shape = Shape {
        seqs: 1,
        seq: h.qkv.len() / d.qkv_width(),
        width: d.width,
        heads: d.heads,
        kv_heads: d.kv_heads,
    };
    attention::forward(h.y, h.att, h.qkv, &[], &mut [], shape);
}

/// Several rows after the cached ones, through blocked products: per head, the scores
/// `[rows, past + rows]` of the rows' queries against every key so far, a causal softmax (row
/// `i` sees keys `0..=past + i`), then the weighted values.
pub(super) fn attend_chunk(h: Heads<'_>, mut cache: Cache<'_>, scores: &mut [f32]) {
    cache.append(h.qkv);
    let d = cache.dims;
    let (c, kv, stride) = (d.width, d.kv_width(), d.qkv_width());
    let rows = h.qkv.len() / stride;
    let keys = cache.past + rows;
    let dh = d.d_head();
    let scale = 1.0 / (dh as f32).sqrt();
    let scores = &mut scores[..rows * keys];
    for head in 0..d.heads {
        let g = head / (d.heads / d.kv_heads);
        let q = View::strided(&h.qkv[head * dh..], rows, dh, stride);
        let k = View::strided(&cache.keys[g * dh..], keys, dh, kv);
        let v = View::strided(&cache.values[g * dh..], keys, dh, kv);
        matmul_into(scores, keys, q, k.t(), scale, false);
        causal_softmax(scores, keys, cache.past);
        let weights = View::strided(scores, rows, keys, keys);
        matmul_into(&mut h.y[head * dh..], c, weights, v, 1.0, false);
    }
}

/// From this many visible keys a row's attention is split over the helpers by heads: below
/// it the hand-off costs more than the heads take.
const SPLIT_VISIBLE: usize = 32;

/// Rows after the cached ones: each query row attends to the cached keys and values up to and
/// including its own, its heads split over `helpers` once the cache is long (`scores` holds a
/// row of `block_size` scores for each thread).
pub(super) fn attend_cached(
    h: Heads<'_>,
    mut cache: Cache<'_>,
    scores: &mut [f32],
    helpers: &Helpers<'_>,
) {
    cache.append(h.qkv);
    let d = cache.dims;
    let (c, kv) = (d.width, d.kv_width());
    let rows =
        h.y.chunks_exact_mut(c)
            .zip(h.qkv.chunks_exact(d.qkv_width()));
    for (r, (y, qkv)) in rows.enumerate() {
        let visible = cache.past + r + 1;
        let (keys, values) = (&cache.keys[..visible * kv], &cache.values[..visible * kv]);
        let q = &qkv[..c];
        if helpers.parts() > 1 && visible >= SPLIT_VISIBLE {
            split_heads(
                helpers,
                y,
                d.d_head(),
                scores,
                d.block_size,
                &|first, y, scores| {
                    attend_heads(
                        y,
                        q,
                        keys,
                        values,
                        &mut scores[..visible],
                        d.kv_heads,
                        first,
                    )
                },
            );
        } else {
            attend(y, q, keys, values, &mut scores[..visible], d.kv_heads);
        }
    }
}

/// One query row's attention over the `visible` cached keys and values, head by head:
/// `y [width] = softmax(q·Kᵀ/√d) · V` with `q [width]`, `keys`, `values [visible, kv_width]`;
/// query head `h` reads key/value head `h / (heads / kv_heads)`. The cache holds only visible
/// tokens, so no causal mask is needed.
pub(crate) fn attend(
    y: &mut [f32],
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut [f32],
    kv_heads: usize,
) {
    attend_heads(y, q, keys, values, scores, kv_heads, 0);
}

vectorized! {
    /// [`attend`] for the heads `first..` that `y` holds (`y [heads_here * d]`), `q` being
    /// the whole row's queries: a thread's share of a row split by heads.
    pub(crate) fn attend_heads(
        y: &mut [f32],
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut [f32],
        kv_heads: usize,
        first: usize,
    ) {
        let visible = scores.len();
        let kv_width = keys.len() / visible;
        let d = kv_width / kv_heads;
        let heads = q.len() / d;
        let scale = 1.0 / (d as f32).sqrt();
        for (i, y) in y.chunks_exact_mut(d).enumerate() {
            let h = first + i;
            let g = h / (heads / kv_heads);
            let kv_head = g * d..(g + 1) * d;
            let q = &q[h * d..(h + 1) * d];
            for (s, k) in scores.iter_mut().zip(keys.chunks_exact(kv_width)) {
                *s = dot_lanes(q, &k[kv_head.clone()]) * scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            // The exponentials in a loop of their own, which vectorises; their sum in order.
            scores.iter_mut().for_each(|s| *s = fast_math::exp(*s - max));
            let total: f32 = scores.iter().fold(0.0, |t, s| t + s);
            let values = values.chunks_exact(kv_width).map(|v| &v[kv_head.clone()]);
            // The weighted values summed in registers where the head size is a usual one
            // (the same sums, in the same order).
            match d {
                64 => weighted::<64>(y, scores, values, total),
                128 => weighted::<128>(y, scores, values, total),
                _ => {
                    y.fill(0.0);
                    for (&s, v) in scores.iter().zip(values) {
                        let p = s / total;
                        y.iter_mut().zip(v).for_each(|(y, v)| *y += p * v);
                    }
                }
            }
        }
    }
}

/// `y [D] = Σ_k (scores[k] / total) · values[k]`, summed over the keys in order in an array
/// the compiler keeps in registers.
#[inline(always)]
fn weighted<'v, const D: usize>(
    y: &mut [f32],
    scores: &[f32],
    values: impl Iterator<Item = &'v [f32]>,
    total: f32,
) {
    let mut acc = [0f32; D];
    for (&s, v) in scores.iter().zip(values) {
        let p = s / total;
        let v: &[f32; D] = v.try_into().expect("a head's values");
        for e in 0..D {
            acc[e] += p * v[e];
        }
    }
    y.copy_from_slice(&acc);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::spin_pool::SpinPool;

    /// [`attend`] written plainly: per head, the scores, their exponentials and the weighted
    /// values, each summed in key order as `attend` sums them.
    fn plain(q: &[f32], keys: &[f32], values: &[f32], visible: usize, d: usize) -> Vec<f32> {
        let (heads, kv_width) = (q.len() / d, keys.len() / visible);
        let group = heads / (kv_width / d);
        let mut y = vec![0.0; q.len()];
        for h in 0..heads {
            let (q, g) = (&q[h * d..(h + 1) * d], h / group);
            let key = |t: usize| &keys[t * kv_width + g * d..t * kv_width + (g + 1) * d];
            let scores: Vec<f32> = (0..visible)
                .map(|t| dot_lanes(q, key(t)) * (1.0 / (d as f32).sqrt()))
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f32> = scores.iter().map(|s| fast_math::exp(s - max)).collect();
            let total = e.iter().fold(0.0, |t, s| t + s);
            for (t, e) in e.iter().enumerate() {
                for i in 0..d {
                    y[h * d + i] += e / total * values[t * kv_width + g * d + i];
                }
            }
        }
        y
    }

    /// Every head size (the register paths of 64 and 128 and any other) gives the plain sums
    /// bit for bit, on one thread and split by heads over three.
    #[test]
    fn attention_over_the_cache_is_the_plain_sums_on_any_threads() {
        let mut pool = SpinPool::new(2);
        let helpers = pool.hold();
        for d in [16, 64, 128] {
            let (heads, kv_heads, visible) = (6, 2, 40);
            let wave = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin()).collect::<Vec<_>>();
            let q = wave(heads * d, 0.37);
            let (keys, values) = (
                wave(visible * kv_heads * d, 0.11),
                wave(visible * kv_heads * d, 0.07),
            );
            let expected = plain(&q, &keys, &values, visible, d);
            let mut y = vec![0.0; heads * d];
            attend(
                &mut y,
                &q,
                &keys,
                &values,
                &mut vec![0.0; visible],
                kv_heads,
            );
            assert_eq!(y, expected, "d = {d}, one thread");
            let mut split = vec![0.0; heads * d];
            let mut scratch = vec![0.0; visible * helpers.parts()];
            split_heads(
                &helpers,
                &mut split,
                d,
                &mut scratch,
                visible,
                &|first, y, scores| attend_heads(y, &q, &keys, &values, scores, kv_heads, first),
            );
            assert_eq!(split, expected, "d = {d}, three threads");
        }
    }
}
