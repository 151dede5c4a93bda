//! f32 weights laid out for decoding: a linear layer's `[n_in, n_out]` (Burn's layout, what
//! training updates) transposed once into `n_out` rows of `n_in`, each output's weights
//! contiguous, as GGUF stores them.
//!
//! A token's product reads every weight once, and with its outputs split over threads each
//! thread then reads one contiguous range of rows. In Burn's layout each thread instead reads
//! a piece of every row, which the hardware prefetchers follow worse (on a Zen 4, one thread's
//! half of thirty `[576, 2304]` products read ~12 GB/s that way against ~19 GB/s as rows).
//! Each output is one [`dot`](super::matmul::dot) of its row, so a row's numbers are the same
//! alone, split over threads, or among other streams.

use super::matmul::{View, dot_lanes, matmul_into};
use super::prefetch;
use crate::fast_math::vectorized;

/// A matrix `[rows, cols]` of f32, row-major: `rows` outputs of `cols` inputs.
#[derive(Debug, Clone, Default)]
pub(crate) struct F32Rows {
    pub rows: usize,
    pub cols: usize,
    pub w: Vec<f32>,
}

impl F32Rows {
    /// A linear layer's weight `w [n_in, n_out]` (Burn's layout) as `n_out` rows of `n_in`.
    pub(crate) fn from_columns(w: &[f32], n_in: usize) -> Self {
        let n_out = w.len() / n_in;
        let mut t = vec![0.0; w.len()];
        for (i, row) in w.chunks_exact(n_out).enumerate() {
            for (j, &v) in row.iter().enumerate() {
                t[j * n_in + i] = v;
            }
        }
        Self {
            rows: n_out,
            cols: n_in,
            w: t,
        }
    }

    fn row(&self, j: usize) -> &[f32] {
        &self.w[j * self.cols..(j + 1) * self.cols]
    }

    /// Rows that make up the distance a product asks ahead for (see [`prefetch`]).
    fn rows_ahead(&self) -> usize {
        prefetch::rows_ahead(self.cols * std::mem::size_of::<f32>())
    }
}

vectorized! {
    /// Outputs `j0..j0 + out.len()` of one row `x [cols]` times `wᵀ` plus `b` (empty: none): a
    /// thread's share of a token's product.
    pub(crate) fn row_range(out: &mut [f32], x: &[f32], w: &F32Rows, b: &[f32], j0: usize) {
        let (ahead, end) = (w.rows_ahead(), j0 + out.len());
        for (o, j) in out.iter_mut().zip(j0..) {
            if j + ahead < end {
                prefetch::lines(w.row(j + ahead));
            }
            *o = dot_lanes(x, w.row(j)) + b.get(j).copied().unwrap_or(0.0);
        }
    }
}

vectorized! {
    /// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b`, every row computed as
    /// [`row_range`] computes it alone; each weight row goes past every activation row while
    /// it is in cache, so it is read from memory once for all of them.
    pub(crate) fn rows_times(out: &mut [f32], x: &[f32], w: &F32Rows, b: &[f32]) {
        let (n, ahead) = (w.rows, w.rows_ahead());
        for j in 0..n {
            if j + ahead < n {
                prefetch::lines(w.row(j + ahead));
            }
            let (row, bias) = (w.row(j), b.get(j).copied().unwrap_or(0.0));
            for (r, x) in x.chunks_exact(w.cols).enumerate() {
                out[r * n + j] = dot_lanes(x, row) + bias;
            }
        }
    }
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b`: row by row as [`rows_times`] (`per_row`:
/// tokens, streams) or as one blocked product through gemm (a prompt's chunk).
pub(crate) fn product(out: &mut [f32], x: &[f32], w: &F32Rows, b: &[f32], per_row: bool) {
    if per_row {
        return rows_times(out, x, w, b);
    }
    // gemm packs the rows read transposed a little slower than training's layout (a prompt of
    // 512 tokens at SmolLM2-135M's shape: ~550 tokens/s against ~610 on a Zen 4), which the
    // token's contiguous rows repay many times over; computing `(w · xᵀ)ᵀ` instead, the rows
    // as gemm's left operand, measured no better.
    let (k, n) = (w.cols, w.rows);
    let weights = View::new(&w.w, n, k).t();
    matmul_into(out, n, View::new(x, x.len() / k, k), weights, 1.0, false);
    if !b.is_empty() {
        out.chunks_exact_mut(n)
            .for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| ((i * 7919 + seed * 104729) % 251) as f32 / 50.0 - 2.5)
            .collect()
    }

    /// Rows, a split row and the blocked product all give `x · w + b` of Burn's layout; the
    /// row by row forms are the same bits as a row alone (with enough outputs that they ask
    /// ahead for later weight rows).
    #[test]
    fn every_form_is_the_product_of_the_burn_layout() {
        let (rows, k, n) = (5, 70, 70);
        let (w, x, b) = (values(k * n, 1), values(rows * k, 2), values(n, 3));
        let t = F32Rows::from_columns(&w, k);
        assert!(
            t.rows_ahead() + 20 < n,
            "the ranges reach the rows asked ahead"
        );
        let want: Vec<f32> = (0..rows * n)
            .map(|i| {
                let (r, j) = (i / n, i % n);
                (0..k).map(|p| x[r * k + p] * w[p * n + j]).sum::<f32>() + b[j]
            })
            .collect();
        for per_row in [true, false] {
            let mut out = vec![0.0; rows * n];
            product(&mut out, &x, &t, &b, per_row);
            for (got, want) in out.iter().zip(&want) {
                assert!(
                    (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{got} {want}"
                );
            }
            if per_row {
                for r in 0..rows {
                    let mut alone = vec![0.0; n];
                    row_range(&mut alone[..20], &x[r * k..(r + 1) * k], &t, &b, 0);
                    row_range(&mut alone[20..], &x[r * k..(r + 1) * k], &t, &b, 20);
                    assert_eq!(alone, out[r * n..(r + 1) * n], "row {r}");
                }
            }
        }
    }
}
