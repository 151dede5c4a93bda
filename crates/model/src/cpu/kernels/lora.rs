//! A LoRA adapter on a linear layer, forward and backward side by side: the frozen product
//! `x · W` is computed as before, and the adapter adds its low-rank path
//!
//! ```text
//! y  += s · (x · A) · B                   x [rows, n_in], A [n_in, r], B [r, n_out]
//! t   = dy · Bᵀ                           [rows, r]
//! dB += s · (x · A)ᵀ · dy                 dA += s · xᵀ · t        dx += s · t · Aᵀ
//! ```
//!
//! never forming `A · B` (`n_in · n_out` numbers) or the frozen weight's gradient. `x · A` is
//! kept from the forward (`rows · r` numbers).

use super::matmul::{View, matmul, matmul_into};

/// `out [rows, n_out] += scale · (x · a) · b`, keeping `xa = x · a` `[rows, rank]`; `a`
/// `[n_in, rank]`, `b` `[rank, n_out]`. Nothing with an empty `a` (no adapter).
pub(crate) fn forward(
    out: &mut [f32],
    xa: &mut Vec<f32>,
    x: &[f32],
    (a, b, scale): (&[f32], &[f32], f32),
    (rows, n_in, n_out): (usize, usize, usize),
) {
    if a.is_empty() {
        return;
    }
    let rank = a.len() / n_in;
    xa.resize(rows * rank, 0.0);
    matmul(
        xa,
        View::new(x, rows, n_in),
        View::new(a, n_in, rank),
        false,
    );
    let xa = View::new(xa, rows, rank);
    matmul_into(out, n_out, xa, View::new(b, rank, n_out), scale, true);
}

/// The backward of [`forward`]: `da += scale · xᵀ · (dy · bᵀ)`, `db += scale · xaᵀ · dy`, and
/// `dx += scale · (dy · bᵀ) · aᵀ` (`dx` holds the frozen product's part already); `t` is
/// scratch. Nothing with an empty `a`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    dx: &mut [f32],
    (da, db): (&mut [f32], &mut [f32]),
    t: &mut Vec<f32>,
    dy: &[f32],
    x: &[f32],
    xa: &[f32],
    (a, b, scale): (&[f32], &[f32], f32),
    (rows, n_in, n_out): (usize, usize, usize),
) {
    if a.is_empty() {
        return;
    }
    let rank = a.len() / n_in;
    t.resize(rows * rank, 0.0);
    let dy = View::new(dy, rows, n_out);
    matmul(t, dy, View::new(b, rank, n_out).t(), false);
    let t = View::new(t, rows, rank);
    matmul_into(db, n_out, View::new(xa, rows, rank).t(), dy, scale, true);
    matmul_into(da, rank, View::new(x, rows, n_in).t(), t, scale, true);
    matmul_into(dx, n_in, t, View::new(a, n_in, rank).t(), scale, true);
}
