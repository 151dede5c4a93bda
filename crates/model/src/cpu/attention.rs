//! Causal self-attention's core for one batch of sequences, forward and backward: scores, the
//! causal mask, softmax, dropout and the weighted sum of values, head by head.
//!
//! The explicit layer (`tinygpt_attention`) builds a `[seq, seq]` boolean mask and fills the
//! hidden scores with `-inf` before the softmax. Here the mask is never materialised: row `t` of
//! the scores only takes the softmax over keys `0..=t` and writes exact zeros after them, which
//! is what `-inf` turns into. The tests check both against each other.

use super::fast_math;
use super::matmul::{View, matmul_into};

/// Sizes of one call: `seqs` sequences of `seq` tokens, `heads` heads over a width of `width`.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub seqs: usize,
    pub seq: usize,
    pub width: usize,
    pub heads: usize,
}

impl Shape {
    fn d_head(&self) -> usize {
        self.width / self.heads
    }

    /// Offset of sequence `s`, head `h` in a `[seqs, heads, seq, seq]` weights buffer.
    fn map(&self, s: usize, h: usize) -> usize {
        (s * self.heads + h) * self.seq * self.seq
    }

    /// `1/√d_head`: keeps the scores' variance near 1 so the softmax does not saturate.
    fn scale(&self) -> f32 {
        1.0 / (self.d_head() as f32).sqrt()
    }
}

/// `qkv [seqs·seq, 3·width]` (columns q | k | v, heads side by side within each) to
/// `y [seqs·seq, width]`. Writes the weights `att [seqs, heads, seq, seq]` after the softmax;
/// `mask` (same shape, empty = no dropout) holds dropout's 0 or `1/(1-p)` per weight.
/// `scratch`: `seq·seq` values.
pub(crate) fn forward(
    y: &mut [f32],
    att: &mut [f32],
    qkv: &[f32],
    mask: &[f32],
    scratch: &mut [f32],
    shape: Shape,
) {
    let Shape { seq, width, .. } = shape;
    let (d, stride) = (shape.d_head(), 3 * width);
    for s in 0..shape.seqs {
        let rows = &qkv[s * seq * stride..];
        for h in 0..shape.heads {
            let q = View::strided(&rows[h * d..], seq, d, stride);
            let k = View::strided(&rows[width + h * d..], seq, d, stride);
            let v = View::strided(&rows[2 * width + h * d..], seq, d, stride);
            let at = shape.map(s, h);
            let weights = &mut att[at..at + seq * seq];
            matmul_into(weights, seq, q, k.t(), shape.scale(), false);
            causal_softmax(weights, seq);
            let kept: &[f32] = if mask.is_empty() {
                weights
            } else {
                for ((o, w), m) in scratch.iter_mut().zip(&*weights).zip(&mask[at..]) {
                    *o = w * m;
                }
                &scratch[..seq * seq]
            };
            let out = &mut y[s * seq * width + h * d..];
            matmul_into(out, width, View::new(kept, seq, seq), v, 1.0, false);
        }
    }
}

fast_math::vectorized! {
    /// Row `t` of `scores [seq, seq]` becomes the softmax over keys `0..=t`, zeros after.
    fn causal_softmax(scores: &mut [f32], seq: usize) {
        for (t, row) in scores.chunks_exact_mut(seq).enumerate() {
            let (visible, hidden) = row.split_at_mut(t + 1);
            let max = visible.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            visible.iter_mut().for_each(|w| *w = fast_math::exp(*w - max));
            let inv = 1.0 / visible.iter().sum::<f32>();
            visible.iter_mut().for_each(|w| *w *= inv);
            hidden.fill(0.0);
        }
    }
}

/// Writes `dqkv` (every element) from `dy`, given the forward's `qkv`, `att` and `mask`.
/// `scratch`: `2·seq·seq` values.
pub(crate) fn backward(
    dqkv: &mut [f32],
    dy: &[f32],
    qkv: &[f32],
    att: &[f32],
    mask: &[f32],
    scratch: &mut [f32],
    shape: Shape,
) {
    let Shape { seq, width, .. } = shape;
    let (d, stride) = (shape.d_head(), 3 * width);
    let (datt, kept) = scratch[..2 * seq * seq].split_at_mut(seq * seq);
    for s in 0..shape.seqs {
        let base = s * seq * stride;
        let rows = &qkv[base..];
        for h in 0..shape.heads {
            let q = View::strided(&rows[h * d..], seq, d, stride);
            let k = View::strided(&rows[width + h * d..], seq, d, stride);
            let v = View::strided(&rows[2 * width + h * d..], seq, d, stride);
            let dy = View::strided(&dy[s * seq * width + h * d..], seq, d, width);
            let at = shape.map(s, h);
            let weights = &att[at..at + seq * seq];
            let kept: &[f32] = if mask.is_empty() {
                weights
            } else {
                for ((o, w), m) in kept.iter_mut().zip(weights).zip(&mask[at..]) {
                    *o = w * m;
                }
                kept
            };
            // y = kept · v: dv = keptᵀ · dy, dkept = dy · vᵀ.
            let dv = &mut dqkv[base + 2 * width + h * d..];
            matmul_into(dv, stride, View::new(kept, seq, seq).t(), dy, 1.0, false);
            matmul_into(datt, seq, dy, v.t(), 1.0, false);
            if !mask.is_empty() {
                datt.iter_mut().zip(&mask[at..]).for_each(|(g, m)| *g *= m);
            }
            // Softmax backward, row by row: dscore = w · (dw - Σ w·dw). Hidden weights are 0,
            // so their scores get no gradient, as behind a -inf mask.
            for (dw, w) in datt.chunks_exact_mut(seq).zip(weights.chunks_exact(seq)) {
                let dot: f32 = dw.iter().zip(w).map(|(g, w)| g * w).sum();
                dw.iter_mut().zip(w).for_each(|(g, w)| *g = w * (*g - dot));
            }
            // scores = scale · q · kᵀ.
            let dscores = View::new(datt, seq, seq);
            let dq = &mut dqkv[base + h * d..];
            matmul_into(dq, stride, dscores, k, shape.scale(), false);
            let dk = &mut dqkv[base + width + h * d..];
            matmul_into(dk, stride, dscores.t(), q, shape.scale(), false);
        }
    }
}
