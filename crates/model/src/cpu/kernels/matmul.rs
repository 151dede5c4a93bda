//! Matrix products over row-major `f32` slices, through the `gemm` crate (AVX-512 kernels when
//! the CPU has them, picked at run time).

use crate::fast_math::vectorized;

/// A matrix read in place: element `(i, j)` is `data[i * row_stride + j * col_stride]`. A
/// transpose is the same slice with the strides swapped, so no product copies its inputs.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    /// `data` as a dense row-major `[rows, cols]` matrix.
    pub(crate) fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// `[rows, cols]` rows `row_stride` apart: a block of columns of a wider matrix.
    pub(crate) fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        let view = Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        };
        view.check();
        view
    }

    /// The transpose `[cols, rows]`, read from the same memory.
    pub(crate) fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }

    /// Panics unless the last element lies inside the slice, which makes every read in bounds.
    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
            assert!(last < self.data.len(), "matrix view out of bounds");
        }
    }
}

/// `out[m, n] (row stride out_stride) = scale · a[m, k] · b[k, n]`, plus `out` when `accumulate`.
pub(crate) fn matmul_into(
    out: &mut [f32],
    out_stride: usize,
    a: View<'_>,
    b: View<'_>,
    scale: f32,
    accumulate: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * out_stride + n <= out.len(),
        "output out of bounds"
    );
    // SAFETY: every index gemm touches is within the bounds checked above and in `View::check`;
    // `out` is borrowed mutably, so it cannot alias `a` or `b`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            out_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Dense `out[m, n] = a[m, k] · b[k, n]` (`+ out` when `accumulate`).
pub(crate) fn matmul(out: &mut [f32], a: View<'_>, b: View<'_>, accumulate: bool) {
    matmul_into(out, b.cols, a, b, 1.0, accumulate);
}

/// `out [rows, n_out] = x [rows, n_in] · w [n_in, n_out] + b` (`b` empty = no bias).
pub(crate) fn linear(
    out: &mut [f32],
    x: &[f32],
    w: &[f32],
    b: &[f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    if rows == 1 {
        return vector_times_matrix(&mut out[..n_out], &x[..n_in], w, b, n_out, 0);
    }
    let bias = !b.is_empty();
    if bias {
        out.chunks_exact_mut(n_out)
            .for_each(|row| row.copy_from_slice(b));
    }
    matmul(
        out,
        View::new(x, rows, n_in),
        View::new(w, n_in, n_out),
        bias,
    );
}

vectorized! {
    /// Columns `j0..j0 + out.len()` of `x [k] · w [k, n] + b`: one row's linear layer in
    /// training's layout. gemm's one-row path packs `w` on every call; this reads it once,
    /// four rows at a time, each added into `out` as a whole vector.
    pub(crate) fn vector_times_matrix(
        out: &mut [f32],
        x: &[f32],
        w: &[f32],
        b: &[f32],
        n: usize,
        j0: usize,
    ) {
        let m = out.len();
        if b.is_empty() {
            out.fill(0.0);
        } else {
            out.copy_from_slice(&b[j0..j0 + m]);
        }
        let row = |i: usize| &w[i * n + j0..i * n + j0 + m];
        let k = x.len();
        for i in (0..k - k % 4).step_by(4) {
            let x4 = &x[i..i + 4];
            let (w0, w1, w2, w3) = (row(i), row(i + 1), row(i + 2), row(i + 3));
            for ((((o, a), b), c), d) in out.iter_mut().zip(w0).zip(w1).zip(w2).zip(w3) {
                *o += x4[0] * a + x4[1] * b + x4[2] * c + x4[3] * d;
            }
        }
        for (i, &xi) in x.iter().enumerate().skip(k - k % 4) {
            out.iter_mut().zip(row(i)).for_each(|(o, w)| *o += xi * w);
        }
    }
}

vectorized! {
    /// `Σ a[i]·b[i]` over sixteen partial sums, so the loop vectorises (a single running sum
    /// must be added in order, which keeps it scalar).
    pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
    }
}

/// The body of [`dot`], for loops already inside a `vectorized!` function.
#[inline(always)]
pub(crate) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (a16, b16) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = a16
        .remainder()
        .iter()
        .zip(b16.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a16.zip(b16) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| ((i * 7919 + seed * 104729) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    #[test]
    fn products_and_transposes_match_the_definition() {
        let (m, k, n) = (37, 19, 23);
        let a = values(m * k, 1);
        let b = values(k * n, 2);
        let want = naive(&a, &b, m, k, n);
        let close =
            |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-4);

        let mut out = vec![0.0; m * n];
        matmul(&mut out, View::new(&a, m, k), View::new(&b, k, n), false);
        assert!(close(&out, &want));

        // aᵀ stored as [k, m] and bᵀ stored as [n, k], read back through `t()`.
        let at: Vec<f32> = (0..k * m).map(|i| a[(i % m) * k + i / m]).collect();
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut out = vec![1.0; m * n];
        matmul(
            &mut out,
            View::new(&at, k, m).t(),
            View::new(&bt, n, k).t(),
            true,
        );
        let plus_one: Vec<f32> = want.iter().map(|w| w + 1.0).collect();
        assert!(close(&out, &plus_one));

        // A column block of a wider matrix, scaled, into a strided output.
        let wide = values(m * 2 * k, 3);
        let block: Vec<f32> = (0..m * k)
            .map(|i| wide[(i / k) * 2 * k + k + i % k])
            .collect();
        let mut out = vec![0.0; m * (n + 5)];
        matmul_into(
            &mut out,
            n + 5,
            View::strided(&wide[k..], m, k, 2 * k),
            View::new(&b, k, n),
            0.5,
            false,
        );
        let want = naive(&block, &b, m, k, n);
        for i in 0..m {
            for j in 0..n {
                assert!((out[i * (n + 5) + j] - 0.5 * want[i * n + j]).abs() < 1e-4);
            }
        }
    }

    #[test]
    #[should_panic(expected = "out of bounds")]
    fn a_view_past_the_slice_is_refused() {
        let data = vec![0.0; 10];
        View::strided(&data, 3, 3, 4);
    }
}
