//! How a block multiplies its rows by a matrix: training's `[n_in, n_out]` f32 layout, or the
//! decoder's rows of outputs in int8 or f32; one row's outputs, or many rows, split over helper
//! threads. [`Ctx`] carries what a block computes with besides its weights.

use super::buffer::Buffer;
use super::dims::Dims;
use super::kernels::blocks::Method;
use super::kernels::k_quants::q4_1::{Q41Matrix, Q51Matrix};
use super::kernels::k_quants::q4_k::{Q4KMatrix, Q5KMatrix};
use super::kernels::k_quants::{self, q6_k::Q6KMatrix};
use super::kernels::matmul::linear;
use super::kernels::prefill;
use super::kernels::q4_0::{self, Q4Matrix};
use super::kernels::q5_0::{self, Q5Matrix};
use super::kernels::q8::{self, Q8Matrix, Q8Rows};
use super::kernels::rope;
use super::kernels::rows::{self, F32Rows};
use super::params::{RowBlock, RowMatrix};
use super::spin_pool::{Helpers, split_columns, split_rows};

/// From this many rows (a prompt's chunk) a product with helpers is split by rows: each thread
/// multiplies its rows by all the weights, which fewer rows could not pay for (every thread
/// reads every weight).
const SPLIT_ROWS: usize = 16;

/// What a block computes with besides its weights: the model's sizes and parts, the rotary
/// tables, and where its rows sit (row `r` at position `first + r % period`: whole sequences in
/// training, the rows after the cache in decoding; or, with `streams`, each row a stream of its
/// own at position `streams[r]`: batched decoding).
#[derive(Clone, Copy)]
pub(super) struct Ctx<'a> {
    pub dims: &'a Dims,
    pub rope: &'a rope::Tables,
    pub first: usize,
    pub period: usize,
    pub streams: Option<&'a [usize]>,
    /// The block's matrices as the decoder keeps them, as rows (`None`: training's layout).
    pub matrices: Option<&'a RowBlock>,
    /// Every row of a product by rows computed as a token alone is, however many rows (a
    /// window scored); otherwise many rows of one sequence take a blocked product. Separate
    /// `streams` always are.
    pub rows_alone: bool,
    /// Many rows (a prompt's) by a quantised matrix multiply in integers where the CPU can
    /// ([`Method::Integer`]), not in f32 of the dequantised weights: the decoder's prompt, not
    /// training (whose gradients are of the f32 product).
    pub integer: bool,
    /// Threads a single row's products are split over (one sequence decoding), if any.
    pub helpers: Option<&'a Helpers<'a>>,
}

/// A linear layer's weight: `[n_in, n_out]` in f32 (training's layout), or the decoder's rows
/// of outputs in int8, four or five bits, or f32.
#[derive(Clone, Copy)]
pub(super) enum Weight<'a> {
    F32(&'a [f32]),
    Q8(&'a Q8Matrix),
    Q4(&'a Q4Matrix),
    Q5(&'a Q5Matrix),
    Q4K(&'a Q4KMatrix),
    Q41(&'a Q41Matrix),
    Q51(&'a Q51Matrix),
    Q5K(&'a Q5KMatrix),
    Q6K(&'a Q6KMatrix),
    Rows(&'a F32Rows),
    /// Ranges of output rows, each its own way, top to bottom.
    Stacked(&'a [RowMatrix]),
}

impl<'a> Weight<'a> {
    /// The decoder's `m`, or `f32` (training's layout) where it keeps none (or a frozen
    /// matrix dequantised in that layout).
    pub(super) fn of(m: Option<&'a RowMatrix>, f32: &'a Buffer) -> Self {
        match m {
            Some(m) => Weight::rows(m),
            None => Weight::F32(f32.values()),
        }
    }

    /// The matrix `m` as the decoder keeps it.
    pub(super) fn rows(m: &'a RowMatrix) -> Self {
        match m {
            RowMatrix::Q8(q) => Weight::Q8(q),
            RowMatrix::Q4(q) => Weight::Q4(q),
            RowMatrix::Q5(q) => Weight::Q5(q),
            RowMatrix::Q4K(q) => Weight::Q4K(q),
            RowMatrix::Q41(q) => Weight::Q41(q),
            RowMatrix::Q51(q) => Weight::Q51(q),
            RowMatrix::Q5K(q) => Weight::Q5K(q),
            RowMatrix::Q6K(q) => Weight::Q6K(q),
            RowMatrix::F32(r) => Weight::Rows(r),
            RowMatrix::Columns(w) => Weight::F32(w),
            RowMatrix::Stacked(parts) => Weight::Stacked(parts),
        }
    }

    /// `out [rows, n_out] = x [rows, n_in] · w + b` on this thread, the decoder's rows by
    /// `method` (see [`Method::of`]; f32 rows either row by row or blocked). Training's layout
    /// is never separate streams: the decoder keeps its matrices as rows.
    pub(super) fn product(
        self,
        out: &mut [f32],
        x: &[f32],
        b: &[f32],
        method: Method,
        n_in: usize,
    ) {
        match self {
            Weight::Q8(w) => {
                if !(method == Method::Integer && prefill::product(out, x, w, b)) {
                    q8::product(out, x, w, b, method == Method::Alone)
                }
            }
            Weight::Q4(w) => q4_0::product(out, x, w, b, method),
            Weight::Q5(w) => q5_0::product(out, x, w, b, method),
            Weight::Q4K(w) => k_quants::product(out, x, w, b, method),
            Weight::Q41(w) => k_quants::product(out, x, w, b, method),
            Weight::Q51(w) => k_quants::product(out, x, w, b, method),
            Weight::Q5K(w) => k_quants::product(out, x, w, b, method),
            Weight::Q6K(w) => k_quants::product(out, x, w, b, method),
            Weight::Rows(w) => rows::product(out, x, w, b, method == Method::Alone),
            Weight::F32(w) => linear(out, x, w, b, x.len() / n_in, n_in, w.len() / n_in),
            Weight::Stacked(parts) => match x.len() / n_in {
                0 => {}
                // A token: the activations quantised once for every part.
                1 => q8::quantized(x, |xq| stacked_range(out, x, xq, parts, b, 0)),
                // Many rows: each part's outputs into scratch, then into their columns.
                rows => {
                    let n_out = out.len() / rows;
                    let mut scratch = Vec::new();
                    each_part(parts, n_in, n_out, b, |part, first, b| {
                        let n = part.out_rows(n_in);
                        scratch.resize(rows * n, 0.0);
                        Weight::rows(part).product(&mut scratch, x, b, method, n_in);
                        for (o, s) in out.chunks_exact_mut(n_out).zip(scratch.chunks_exact(n)) {
                            o[first..first + n].copy_from_slice(s);
                        }
                    });
                }
            },
        }
    }
}

/// `f(part, first output, its bias)` for each part of a stacked matrix of `n_out` outputs whose
/// rows are `n_in` long, `b` the whole bias (empty: none).
fn each_part(
    parts: &[RowMatrix],
    n_in: usize,
    n_out: usize,
    b: &[f32],
    mut f: impl FnMut(&RowMatrix, usize, &[f32]),
) {
    let mut first = 0;
    for part in parts {
        let n = part.out_rows(n_in);
        let bias = if b.is_empty() {
            b
        } else {
            &b[first..first + n]
        };
        f(part, first, bias);
        first += n;
    }
    debug_assert_eq!(first, n_out, "the parts fill the matrix");
}

/// How a product of `rows` rows by the decoder's rows runs: row by row, each as a token alone
/// is computed (a token, separate streams or rows scored as tokens: `alone`), or as one
/// blocked product (a prompt's chunk) in f32 of the dequantised weights.
pub(super) fn per_row(alone: bool, rows: usize) -> Method {
    Method::of(alone, false, rows)
}

impl<'a> Ctx<'a> {
    pub(super) fn position(&self, row: usize) -> usize {
        match self.streams {
            Some(positions) => positions[row],
            None => self.first + row % self.period,
        }
    }

    /// The weight `f32` (`[n_in, n_out]`), or its rows where the decoder keeps `which` of
    /// them so.
    pub(super) fn weight<'w>(
        &self,
        f32: &'w Buffer,
        which: fn(&RowBlock) -> &Option<RowMatrix>,
    ) -> Weight<'w>
    where
        'a: 'w,
    {
        Weight::of(self.matrices.and_then(|q| which(q).as_ref()), f32)
    }

    /// A linear layer over the rows; separate streams each as if alone. With helpers, one
    /// row's outputs are split over the threads, and [`SPLIT_ROWS`] or more rows by rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear(
        &self,
        out: &mut [f32],
        x: &[f32],
        w: Weight<'_>,
        b: Option<&[f32]>,
        rows: usize,
        n_in: usize,
        n_out: usize,
    ) {
        // The product kernels read an empty bias as none, as llm.c's read a null one.
        let b = b.unwrap_or(&[]);
        let (out, x) = (&mut out[..rows * n_out], &x[..rows * n_in]);
        let helpers = self.helpers.filter(|h| h.parts() > 1);
        match helpers {
            Some(helpers) if rows == 1 => linear_split(out, x, w, b, helpers),
            Some(helpers) if rows >= SPLIT_ROWS => {
                let method = self.method(w, rows);
                split_rows(helpers, out, n_out, &|part, r0| {
                    let x = &x[r0 * n_in..(r0 + part.len() / n_out) * n_in];
                    w.product(part, x, b, method, n_in);
                });
            }
            _ => w.product(out, x, b, self.method(w, rows), n_in),
        }
    }

    /// [`Method::of`] this block's rows, decided on the whole product so that a thread's
    /// share of its rows is computed as the whole would be.
    fn method(&self, w: Weight<'_>, rows: usize) -> Method {
        let rows_of_decoder = matches!(
            w,
            Weight::Q8(_)
                | Weight::Q4(_)
                | Weight::Q5(_)
                | Weight::Q4K(_)
                | Weight::Q41(_)
                | Weight::Q51(_)
                | Weight::Q5K(_)
                | Weight::Q6K(_)
                | Weight::Rows(_)
                | Weight::Stacked(_)
        );
        match rows_of_decoder {
            true => Method::of(
                self.rows_alone || self.streams.is_some(),
                self.integer,
                rows,
            ),
            false => Method::Dequantised,
        }
    }
}

/// One row's linear layer `out [n_out] = x [n_in] · w + b`, its outputs split over `helpers`'
/// threads (each output computed as on one thread).
pub(super) fn linear_split(
    out: &mut [f32],
    x: &[f32],
    w: Weight<'_>,
    b: &[f32],
    helpers: &Helpers<'_>,
) {
    match w {
        Weight::Q8(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| q8::row_range(part, x, w, b, j0));
        }),
        Weight::Q4(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| q4_0::row_range(part, x, w, b, j0));
        }),
        Weight::Q5(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| q5_0::row_range(part, x, w, b, j0));
        }),
        Weight::Q4K(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| {
                k_quants::row_range(part, x, w, b, j0)
            });
        }),
        Weight::Q41(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| {
                k_quants::row_range(part, x, w, b, j0)
            });
        }),
        Weight::Q51(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| {
                k_quants::row_range(part, x, w, b, j0)
            });
        }),
        Weight::Q5K(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| {
                k_quants::row_range(part, x, w, b, j0)
            });
        }),
        Weight::Q6K(w) => q8::quantized(x, |x| {
            split_columns(helpers, out, &|part, j0| {
                k_quants::row_range(part, x, w, b, j0)
            });
        }),
        Weight::Rows(w) => split_columns(helpers, out, &|part, j0| {
            rows::row_range(part, x, w, b, j0);
        }),
        // Training's layout (the decoder keeps its matrices as rows): on this thread.
        Weight::F32(w) => linear(out, x, w, b, 1, x.len(), out.len()),
        // The activations quantised once for every part, and one split of all the outputs.
        Weight::Stacked(parts) => q8::quantized(x, |xq| {
            split_columns(helpers, out, &|share, j0| {
                stacked_range(share, x, xq, parts, b, j0);
            });
        }),
    }
}

/// Outputs `j0..j0 + out.len()` of one row `x` (`xq`: it quantised) times the stacked matrix
/// `parts` plus `b` (empty: none): each output as its part's own share of a token computes it.
fn stacked_range(
    out: &mut [f32],
    x: &[f32],
    xq: &Q8Rows,
    parts: &[RowMatrix],
    b: &[f32],
    j0: usize,
) {
    let (n_in, end) = (x.len(), j0 + out.len());
    let mut first = 0;
    for part in parts {
        let n = part.out_rows(n_in);
        let (lo, hi) = (j0.max(first), end.min(first + n));
        if lo < hi {
            let share = &mut out[lo - j0..hi - j0];
            let bias = if b.is_empty() {
                b
            } else {
                &b[first..first + n]
            };
            let local = lo - first;
            match part {
                RowMatrix::Q8(w) => q8::row_range(share, xq, w, bias, local),
                RowMatrix::Q4(w) => q4_0::row_range(share, xq, w, bias, local),
                RowMatrix::Q5(w) => q5_0::row_range(share, xq, w, bias, local),
                RowMatrix::Q4K(w) => k_quants::row_range(share, xq, w, bias, local),
                RowMatrix::Q41(w) => k_quants::row_range(share, xq, w, bias, local),
                RowMatrix::Q51(w) => k_quants::row_range(share, xq, w, bias, local),
                RowMatrix::Q5K(w) => k_quants::row_range(share, xq, w, bias, local),
                RowMatrix::Q6K(w) => k_quants::row_range(share, xq, w, bias, local),
                RowMatrix::F32(w) => rows::row_range(share, x, w, bias, local),
                RowMatrix::Columns(w) => {
                    for (o, j) in share.iter_mut().zip(local..) {
                        let dot = (0..n_in).map(|i| x[i] * w[i * n + j]).sum::<f32>();
                        *o = dot + bias.get(j).copied().unwrap_or(0.0);
                    }
                }
                RowMatrix::Stacked(inner) => stacked_range(share, x, xq, inner, bias, local),
            }
        }
        first += n;
    }
}
