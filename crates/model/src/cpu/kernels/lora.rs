//! A LoRA adapter on a linear layer, forward and backward side by side: the frozen product
//! `x · W` is computed as before, and the adapter adds its low-rank path on its own input,
//! dropped out (`[lora] dropout`, PEFT's `lora_dropout`: `m` holds 0 or `1/(1-p)`, none = 1)
//!
//! ```text
//! y  += s · ((x ⊙ m) · A) · B             x [rows, n_in], A [n_in, r], B [r, n_out]
//! t   = dy · Bᵀ                           [rows, r]
//! dB += s · ((x ⊙ m) · A)ᵀ · dy           dA += s · (x ⊙ m)ᵀ · t
//! dx += s · (t · Aᵀ) ⊙ m
//! ```
//!
//! never forming `A · B` (`n_in · n_out` numbers) or the frozen weight's gradient. `(x ⊙ m) · A`
//! is kept from the forward (`rows · r` numbers); the dropped input `x ⊙ m` is not kept: it is
//! made again a few rows at a time where a product needs it.

use std::ops::Range;

use super::matmul::{View, matmul, matmul_into};

/// Rows of `x ⊙ m` made at a time: a small scratch, whatever the batch.
const CHUNK: usize = 64;

/// An adapter's input `[rows, n_in]` and its dropout scales (empty: no dropout).
pub(crate) type Input<'a> = (&'a [f32], &'a [f32]);

/// `out [rows, n_out] += scale · ((x ⊙ m) · a) · b`, keeping `xa = (x ⊙ m) · a` `[rows,
/// rank]`; `a` `[n_in, rank]`, `b` `[rank, n_out]`.
pub(crate) fn forward(
    out: &mut [f32],
    xa: &mut Vec<f32>,
    (x, mask): Input<'_>,
    (a, b, scale): (&[f32], &[f32], f32),
    (rows, n_in, n_out): (usize, usize, usize),
) {
    let rank = a.len() / n_in;
    xa.resize(rows * rank, 0.0);
    let a_view = View::new(a, n_in, rank);
    if mask.is_empty() {
        matmul(xa, View::new(x, rows, n_in), a_view, false);
    } else {
        let mut dropped = Vec::new();
        for r in chunks(rows) {
            let xd = dropped_rows(&mut dropped, (x, mask), r.clone(), n_in);
            matmul(&mut xa[r.start * rank..r.end * rank], xd, a_view, false);
        }
    }
    let xa = View::new(xa, rows, rank);
    matmul_into(out, n_out, xa, View::new(b, rank, n_out), scale, true);
}

/// The backward of [`forward`]: `da += scale · (x ⊙ m)ᵀ · (dy · bᵀ)`, `db += scale · xaᵀ · dy`,
/// and `dx += scale · ((dy · bᵀ) · aᵀ) ⊙ m` (`dx` holds the frozen product's part already); `t`
/// is scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dx: &mut [f32],
    (da, db): (&mut [f32], &mut [f32]),
    t: &mut Vec<f32>,
    dy: &[f32],
    (x, mask): Input<'_>,
    xa: &[f32],
    (a, b, scale): (&[f32], &[f32], f32),
    (rows, n_in, n_out): (usize, usize, usize),
) {
    let rank = a.len() / n_in;
    t.resize(rows * rank, 0.0);
    let dy = View::new(dy, rows, n_out);
    matmul(t, dy, View::new(b, rank, n_out).t(), false);
    matmul_into(db, n_out, View::new(xa, rows, rank).t(), dy, scale, true);
    let a_t = View::new(a, n_in, rank).t();
    if mask.is_empty() {
        let t = View::new(t, rows, rank);
        matmul_into(da, rank, View::new(x, rows, n_in).t(), t, scale, true);
        matmul_into(dx, n_in, t, a_t, scale, true);
        return;
    }
    let (mut dropped, mut back) = (Vec::new(), Vec::new());
    for r in chunks(rows) {
        let t_rows = View::new(&t[r.start * rank..r.end * rank], r.len(), rank);
        let xd = dropped_rows(&mut dropped, (x, mask), r.clone(), n_in);
        matmul_into(da, rank, xd.t(), t_rows, scale, true);
        back.resize(r.len() * n_in, 0.0);
        matmul(&mut back, t_rows, a_t, false);
        let (dx, m) = (
            &mut dx[r.start * n_in..r.end * n_in],
            &mask[r.start * n_in..],
        );
        for ((dx, g), m) in dx.iter_mut().zip(&back).zip(m) {
            *dx += scale * g * m;
        }
    }
}

/// `0..rows` in pieces of [`CHUNK`] rows.
fn chunks(rows: usize) -> impl Iterator<Item = Range<usize>> {
    (0..rows)
        .step_by(CHUNK)
        .map(move |start| start..(start + CHUNK).min(rows))
}

/// Rows `r` of `x ⊙ mask` (`[rows, n_in]` both), written into `scratch`.
fn dropped_rows<'s>(
    scratch: &'s mut Vec<f32>,
    (x, mask): Input<'_>,
    r: Range<usize>,
    n_in: usize,
) -> View<'s> {
    let span = r.start * n_in..r.end * n_in;
    scratch.clear();
    scratch.extend(x[span.clone()].iter().zip(&mask[span]).map(|(x, m)| x * m));
    View::new(scratch, r.len(), n_in)
}
