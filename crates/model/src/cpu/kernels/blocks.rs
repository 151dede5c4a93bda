//! What the decoding products of GGUF's block types multiplied by `Q8_0`'s activations share
//! (`Q4_0`, `Q5_0`, and the k-quants `Q4_K`, `Q5_K`, `Q6_K`): a matrix of rows of blocks, a kernel's
//! two entries (a row's product and a thread's share of rows with that product inlined), and
//! the loops around them.
//!
//! Each type's module defines its blocks, its kernels and their exact reference; the loops here
//! are the same for all, so each output is computed the same way whichever loop reaches it.

use super::prefill::{self, Unpack};
use super::q8::{self, Q8Rows, XRow};

/// A matrix `[rows, cols]` of blocks along each row.
pub(crate) trait BlockMatrix: Sync {
    /// Everything a row's product reads: its blocks' values and scales.
    type Row<'a>: Copy
    where
        Self: 'a;
    /// `(rows, cols)`.
    fn shape(&self) -> (usize, usize);
    /// Row `j`.
    fn row(&self, j: usize) -> Self::Row<'_>;
    /// Row `j`'s values into `out [cols]`, allocating nothing (a prompt's product dequantises
    /// every row).
    fn dequantise_row(&self, j: usize, out: &mut [f32]);
}

/// A weight row times a quantised activation row.
pub(crate) type Dot<M> = for<'a, 'x> fn(<M as BlockMatrix>::Row<'a>, XRow<'x>) -> f32;

/// A thread's share of a token's product, as [`each_row`].
pub(crate) type Rows<M> = fn(&mut [f32], &Q8Rows, &M, &[f32], usize);

/// One exact kernel: a row's product, and a share of rows with that product inlined.
pub(crate) struct Kernel<M: BlockMatrix + 'static> {
    /// What the tests call it when its floats differ from the reference's.
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    pub dot: Dot<M>,
    pub rows: Rows<M>,
}

impl<M: BlockMatrix> Clone for Kernel<M> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<M: BlockMatrix> Copy for Kernel<M> {}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b` (`b` empty: no
/// bias) by `dot`: inlined into each kernel's `rows`, so that the kernel's product is inlined
/// into the loop too (no call through a pointer for each row).
#[inline(always)]
pub(crate) fn each_row<M: BlockMatrix>(
    out: &mut [f32],
    x: &Q8Rows,
    w: &M,
    b: &[f32],
    j0: usize,
    dot: impl Fn(M::Row<'_>, XRow<'_>) -> f32,
) {
    let x = x.one();
    for (o, j) in out.iter_mut().zip(j0..) {
        *o = dot(w.row(j), x) + b.get(j).copied().unwrap_or(0.0);
    }
}

/// How a product by a quantised matrix computes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// Each row as a token alone is: the type's exact kernel (a token, separate streams, rows
    /// scored as tokens).
    Alone,
    /// Many rows at once in integers, the activations quantised as a token's
    /// ([`prefill`]: a prompt's chunk, where the CPU has a kernel for the type).
    Integer,
    /// Many rows at once in f32, of the dequantised weights (training's frozen base; a
    /// prompt on a CPU without AVX2).
    Dequantised,
}

impl Method {
    /// A product of `rows` rows: [`Method::Alone`] for `alone` or fewer than
    /// [`q8::GEMM_ROWS`]; else in integers where asked (`integer`) and [`prefill::runs`].
    pub(crate) fn of(alone: bool, integer: bool, rows: usize) -> Self {
        match (alone || rows < q8::GEMM_ROWS, integer && prefill::runs()) {
            (true, _) => Method::Alone,
            (false, true) => Method::Integer,
            (false, false) => Method::Dequantised,
        }
    }
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` by `method`: `kernel`'s quantised products
/// (each row as it would be alone: each weight row goes past every activation row while it
/// is in cache), a prompt's integer product, or f32 products of the dequantised weights.
pub(crate) fn product<M: BlockMatrix + Unpack>(
    out: &mut [f32],
    x: &[f32],
    w: &M,
    b: &[f32],
    method: Method,
    kernel: Kernel<M>,
) {
    let (n, k) = w.shape();
    let integer = method == Method::Integer && prefill::product(out, x, w, b);
    match method {
        Method::Integer if integer => {}
        Method::Alone => q8::quantized(x, |x| {
            let rows = x.q.len() / k;
            for j in 0..n {
                let (row, bias) = (w.row(j), b.get(j).copied().unwrap_or(0.0));
                for r in 0..rows {
                    out[r * n + j] = (kernel.dot)(row, x.row(r, k)) + bias;
                }
            }
        }),
        // A prompt on a CPU without an integer kernel for this type.
        Method::Integer | Method::Dequantised => {
            q8::dequantised_product(out, x, k, n, b, |j, values| w.dequantise_row(j, values))
        }
    }
}

/// Whether this CPU (and build) runs the block types' AVX-512 VNNI kernels (AVX-512 F, BW, VL
/// and VNNI, with AVX2, FMA and F16C; the `avx512` feature) and their AVX2 ones (AVX2, FMA,
/// F16C).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vector_sets() -> (bool, bool) {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let vnni = has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni");
    (cfg!(feature = "avx512") && avx2 && vnni, avx2)
}

/// Of a block type's `avx512` (VNNI), `avx2` and `reference` kernels, those this CPU runs,
/// fastest first: a vector kernel is returned only where [`vector_sets`] found its features,
/// which is what makes calling it sound.
#[cfg(target_arch = "x86_64")]
pub(crate) fn runnable<M: BlockMatrix>(
    avx512: Kernel<M>,
    avx2: Kernel<M>,
    reference: Kernel<M>,
) -> Vec<Kernel<M>> {
    let (vnni, has_avx2) = vector_sets();
    [(vnni, avx512), (has_avx2, avx2), (true, reference)]
        .into_iter()
        .filter_map(|(runs, kernel)| runs.then_some(kernel))
        .collect()
}
