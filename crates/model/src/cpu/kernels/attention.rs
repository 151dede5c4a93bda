//! Causal self-attention's core for one batch of sequences, forward and backward: scores, the
//! causal mask, softmax, dropout and the weighted sum of values, head by head.
//!
//! The explicit layer (`tinygpt_attention`) builds a `[seq, seq]` boolean mask and fills the
//! hidden scores with `-1e9` (`MASKED_SCORE`) before the softmax, whose `exp` is exactly 0 in
//! f32. Here the mask is never materialised: row `t` of the scores only takes the softmax over
//! keys `0..=t` and writes exact zeros after them, the weights that fill gives. The tests check
//! both against each other.

use super::matmul::{View, matmul_into};
use crate::fast_math;

/// Sizes of one call: `seqs` sequences of `seq` tokens, `heads` query heads over a width of
/// `width`, sharing `kv_heads` key/value heads in groups (grouped-query attention: query head
/// `h` reads key/value head `h / (heads / kv_heads)`; `kv_heads = heads` is multi-head).
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub seqs: usize,
    pub seq: usize,
    pub width: usize,
    pub heads: usize,
    pub kv_heads: usize,
}

impl Shape {
    fn d_head(&self) -> usize {
        self.width / self.heads
    }

    /// Columns of a `qkv` row: `heads` query, then `kv_heads` key and `kv_heads` value heads.
    fn stride(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.d_head()
    }

    /// Column offsets of the key and the value head query head `h` reads.
    fn kv_columns(&self, h: usize) -> (usize, usize) {
        let d = self.d_head();
        let g = h / (self.heads / self.kv_heads);
        (self.width + g * d, self.width + (self.kv_heads + g) * d)
    }

    /// Offset of sequence `s`, head `h` in a `[seqs, heads, seq, seq]` weights buffer.
    fn map(&self, s: usize, h: usize) -> usize {
        (s * self.heads + h) * self.seq * self.seq
    }

    /// Head `h`'s queries for rows `r0..r1` and its keys and values for rows `0..r1`, read in
    /// place from one sequence's `qkv` rows.
    fn views<'a>(&self, rows: &'a [f32], h: usize, r0: usize, r1: usize) -> [View<'a>; 3] {
        let (d, stride) = (self.d_head(), self.stride());
        let (k, v) = self.kv_columns(h);
        [
            View::strided(&rows[r0 * stride + h * d..], r1 - r0, d, stride),
            View::strided(&rows[k..], r1, d, stride),
            View::strided(&rows[v..], r1, d, stride),
        ]
    }

    /// `1/√d_head`: keeps the scores' variance near 1 so the softmax does not saturate.
    fn scale(&self) -> f32 {
        1.0 / (self.d_head() as f32).sqrt()
    }
}

/// Queries are taken in blocks of this many rows: block `i` only needs keys `0..(i+1)·BLOCK`,
/// so the products skip most of the hidden upper triangle (a 256-token sequence does 10 of the 16
/// key blocks a full `[seq, seq]` product would).
const BLOCK: usize = 64;

/// The query blocks of a sequence: `(first row, end row)`; keys `0..end` are visible to them.
fn blocks(seq: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..seq)
        .step_by(BLOCK)
        .map(move |r0| (r0, (r0 + BLOCK).min(seq)))
}

/// `qkv [seqs·seq, stride]` (columns q | k | v, heads side by side within each) to
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
    let (d, stride) = (shape.d_head(), shape.stride());
    for s in 0..shape.seqs {
        let rows = &qkv[s * seq * stride..];
        for h in 0..shape.heads {
            let at = shape.map(s, h);
            let weights = &mut att[at..at + seq * seq];
            if !mask.is_empty() {
                scratch[..seq * seq].fill(0.0);
            }
            for (r0, r1) in blocks(seq) {
                let [q, k, v] = shape.views(rows, h, r0, r1);
                let block = &mut weights[r0 * seq..r1 * seq];
                matmul_into(block, seq, q, k.t(), shape.scale(), false);
                causal_softmax(block, seq, r0);
                let kept: &[f32] = if mask.is_empty() {
                    block
                } else {
                    let kept = &mut scratch[r0 * seq..r1 * seq];
                    for ((o, w), m) in kept.iter_mut().zip(&*block).zip(&mask[at + r0 * seq..]) {
                        *o = w * m;
                    }
                    kept
                };
                let out = &mut y[(s * seq + r0) * width + h * d..];
                let kept = View::strided(kept, r1 - r0, r1, seq);
                matmul_into(out, width, kept, v, 1.0, false);
            }
        }
    }
}

fast_math::vectorized! {
    /// Row `i` of `scores [rows, seq]`, the query at position `first + i`, becomes the softmax
    /// over keys `0..=first + i`, zeros after.
    pub(crate) fn causal_softmax(scores: &mut [f32], seq: usize, first: usize) {
        for (i, row) in scores.chunks_exact_mut(seq).enumerate() {
            let (visible, hidden) = row.split_at_mut(first + i + 1);
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
    let (d, stride) = (shape.d_head(), shape.stride());
    let (datt, kept) = scratch[..2 * seq * seq].split_at_mut(seq * seq);
    // Keys and values collect gradient from every later query block, and from every query head
    // of their group.
    dqkv.fill(0.0);
    for s in 0..shape.seqs {
        let base = s * seq * stride;
        let rows = &qkv[base..];
        for h in 0..shape.heads {
            let at = shape.map(s, h);
            let (k_at, v_at) = shape.kv_columns(h);
            for (r0, r1) in blocks(seq) {
                let n = r1 - r0;
                let [q, k, v] = shape.views(rows, h, r0, r1);
                let dy = View::strided(&dy[(s * seq + r0) * width + h * d..], n, d, width);
                let weights = &att[at + r0 * seq..at + r1 * seq];
                let mask = if mask.is_empty() {
                    &[][..]
                } else {
                    &mask[at + r0 * seq..at + r1 * seq]
                };
                let kept: &[f32] = if mask.is_empty() {
                    weights
                } else {
                    let kept = &mut kept[..n * seq];
                    for ((o, w), m) in kept.iter_mut().zip(weights).zip(mask) {
                        *o = w * m;
                    }
                    kept
                };
                // y = kept · v: dv += keptᵀ · dy, dkept = dy · vᵀ.
                let dv = &mut dqkv[base + v_at..];
                let kept = View::strided(kept, n, r1, seq);
                matmul_into(dv, stride, kept.t(), dy, 1.0, true);
                let datt = &mut datt[..n * seq];
                matmul_into(datt, seq, dy, v.t(), 1.0, false);
                if !mask.is_empty() {
                    datt.iter_mut().zip(mask).for_each(|(g, m)| *g *= m);
                }
                // Softmax backward, row by row: dscore = w · (dw - Σ w·dw). Hidden weights are
                // 0, so their scores get no gradient, as behind the masked fill.
                for (dw, w) in datt.chunks_exact_mut(seq).zip(weights.chunks_exact(seq)) {
                    let (dw, w) = (&mut dw[..r1], &w[..r1]);
                    let dot: f32 = dw.iter().zip(w).map(|(g, w)| g * w).sum();
                    dw.iter_mut().zip(w).for_each(|(g, w)| *g = w * (*g - dot));
                }
                // scores = scale · q · kᵀ.
                let dscores = View::strided(datt, n, r1, seq);
                let dq = &mut dqkv[base + r0 * stride + h * d..];
                matmul_into(dq, stride, dscores, k, shape.scale(), false);
                let dk = &mut dqkv[base + k_at..];
                matmul_into(dk, stride, dscores.t(), q, shape.scale(), true);
            }
        }
    }
}
