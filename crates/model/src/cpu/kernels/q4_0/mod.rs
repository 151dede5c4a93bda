//! Four-bit weights for decoding: GGUF's `Q4_0` (blocks of 32 values along a weight row, one
//! f16 scale each, the values as nibbles: value = `(nibble - 8) · d`), multiplied by the same
//! quantised activations as `Q8_0`'s ([`q8::Q8Rows`]: blocks of 32 signed bytes, an f32 scale).
//!
//! 0.5625 bytes a weight against `Q8_0`'s 1.0625: a token of decoding reads about half the
//! bytes. A block's nibbles widen to the bytes `nibble - 8` in registers, and from there the
//! product is `Q8_0`'s: the same lanes, the same sums in the same order. So a `Q4_0` row
//! times an activation row is, bit for bit, [`q8::dot_reference`] of its widened bytes, which
//! the tests check. A product of many rows (a prompt) multiplies the dequantised weights in
//! f32, as `Q8_0`'s does.

use half::f16;

use super::q8::{self, BLOCK, Q8Rows};
use super::rows::F32Rows;

/// Bytes of a block's nibbles: value `i` (of 32) in byte `i mod 16`, the low nibble for the
/// first 16, the high for the rest (ggml's layout).
const NIBBLES: usize = BLOCK / 2;

/// A matrix `[rows, cols]` of `Q4_0` blocks along each row (`cols` a multiple of [`BLOCK`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Q4Matrix {
    pub rows: usize,
    pub cols: usize,
    /// `[rows, cols / 32]`.
    scales: Vec<f16>,
    /// `[rows, cols / 2]`: each block's 16 bytes.
    nibbles: Vec<u8>,
}

/// One block of 32 values as ggml's reference quantiser writes it (`quantize_row_q4_0_ref`):
/// `d = v / -8` for the value `v` of the largest magnitude (the first such), rounded to f16;
/// each value's nibble `min(15, trunc(x · (1/d) + 8.5))`, `1/d` taken from the f32 `d`.
pub(crate) fn quantize_block(x: &[f32], nibbles: &mut [u8]) -> f16 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            (amax, max) = (v.abs(), v);
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // C's `(int8_t)` truncates toward zero; `x · id + 8.5` is at least 0.5 here.
    let nibble = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
    for (j, b) in nibbles.iter_mut().enumerate() {
        *b = nibble(x[j]) | (nibble(x[j + NIBBLES]) << 4);
    }
    f16::from_f32(d)
}

impl Q4Matrix {
    /// `values [rows, cols]` quantised row by row by [`quantize_block`].
    pub(crate) fn from_rows(values: &[f32], cols: usize) -> Self {
        assert!(cols.is_multiple_of(BLOCK), "a Q4_0 row is whole blocks");
        let rows = values.len() / cols;
        let mut nibbles = vec![0u8; rows * cols / 2];
        let scales = values
            .chunks_exact(BLOCK)
            .zip(nibbles.chunks_exact_mut(NIBBLES))
            .map(|(x, q)| quantize_block(x, q))
            .collect();
        Self {
            rows,
            cols,
            scales,
            nibbles,
        }
    }

    /// A linear layer's weight `w [n_in, n_out]` (Burn's layout) as `n_out` rows of `n_in`.
    pub(crate) fn from_columns(w: &[f32], n_in: usize) -> Self {
        Self::from_rows(&F32Rows::from_columns(w, n_in).w, n_in)
    }

    /// Bytes it holds: half a byte a weight and two a block's scale.
    pub(crate) fn bytes(&self) -> usize {
        self.nibbles.len() + 2 * self.scales.len()
    }

    /// Row `j`: its nibbles `[cols / 2]` and its blocks' scales `[cols / 32]`.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> (&[u8], &[f16]) {
        let (nb, kb) = (self.cols / 2, self.cols / BLOCK);
        (
            &self.nibbles[j * nb..(j + 1) * nb],
            &self.scales[j * kb..(j + 1) * kb],
        )
    }

    /// Row `j`'s values `(nibble - 8) · d` into `out` `[cols]` (ggml's `dequantize_row_q4_0`),
    /// allocating nothing: a prompt's product dequantises every row of every matrix.
    pub(crate) fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        let (q, d) = self.row(j);
        let mut widened = [0i8; BLOCK];
        let blocks = out.chunks_exact_mut(BLOCK).zip(q.chunks_exact(NIBBLES));
        for ((values, q), d) in blocks.zip(d) {
            let d = d.to_f32();
            widen_block(q, &mut widened);
            values
                .iter_mut()
                .zip(widened)
                .for_each(|(v, q)| *v = f32::from(q) * d);
        }
    }
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` by quantised products (each row as it
/// would be alone), or, `quantised` false, by f32 products of the dequantised weights.
pub(crate) fn product(out: &mut [f32], x: &[f32], w: &Q4Matrix, b: &[f32], quantised: bool) {
    match quantised {
        true => q8::quantized(x, |rows| rows_times(out, rows, w, b)),
        false => q8::dequantised_product(out, x, w.cols, w.rows, b, |j, values| {
            w.dequantise_row(j, values)
        }),
    }
}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b`: a thread's share
/// of a token's product.
pub(crate) fn row_range(out: &mut [f32], x: &Q8Rows, w: &Q4Matrix, b: &[f32], j0: usize) {
    let dot = dot_kernel();
    for (o, j) in out.iter_mut().zip(j0..) {
        let (wq, ws) = w.row(j);
        *o = dot(wq, ws, &x.q, &x.d) + b.get(j).copied().unwrap_or(0.0);
    }
}

/// [`product`]'s quantised form, `x` already quantised: each weight row goes past every
/// activation row while it is in cache.
fn rows_times(out: &mut [f32], x: &Q8Rows, w: &Q4Matrix, b: &[f32]) {
    let (k, n) = (w.cols, w.rows);
    let kb = k / BLOCK;
    let rows = x.q.len() / k;
    let dot = dot_kernel();
    for j in 0..n {
        let (wq, ws) = w.row(j);
        let bias = b.get(j).copied().unwrap_or(0.0);
        for r in 0..rows {
            let (xq, xd) = (&x.q[r * k..(r + 1) * k], &x.d[r * kb..(r + 1) * kb]);
            out[r * n + j] = dot(wq, ws, xq, xd) + bias;
        }
    }
}

/// A weight row (`wq [k / 2]` nibbles, its scales `ws [k / 32]`) times a quantised activation
/// row (`xq [k]`, `xd [k / 32]`).
pub(crate) type Dot = fn(&[u8], &[f16], &[i8], &[f32]) -> f32;

/// The fastest exact product this CPU runs, chosen once.
fn dot_kernel() -> Dot {
    static FASTEST: std::sync::OnceLock<Dot> = std::sync::OnceLock::new();
    *FASTEST.get_or_init(|| dot_kernels()[0].1)
}

/// Every product this CPU runs, fastest first, by name; the last is the reference. Each
/// computes the same floats bit for bit.
pub(crate) fn dot_kernels() -> Vec<(&'static str, Dot)> {
    let mut found: Vec<(&'static str, Dot)> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            // SAFETY: the features the kernel is compiled for were just detected.
            found.push(("avx2", |wq, ws, xq, xd| unsafe {
                avx2::dot(wq, ws, xq, xd)
            }));
        }
    }
    found.push(("reference", dot_reference));
    found
}

/// The numbers every kernel computes: [`q8::dot_reference`] of the row's widened bytes. CPUs
/// without AVX2 run it, so it widens a block at a time and allocates nothing.
pub(crate) fn dot_reference(wq: &[u8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
    q8::dot_reference_with(ws, xq, xd, |b, w| {
        widen_block(&wq[b * NIBBLES..(b + 1) * NIBBLES], w)
    })
}

/// A block's 16 bytes of nibbles as the 32 bytes `nibble - 8`, in value order.
fn widen_block(nibbles: &[u8], out: &mut [i8; BLOCK]) {
    let (low, high) = out.split_at_mut(NIBBLES);
    for ((l, h), &n) in low.iter_mut().zip(high).zip(nibbles) {
        (*l, *h) = ((n & 0x0F) as i8 - 8, (n >> 4) as i8 - 8);
    }
}

/// Blocks of nibbles as the bytes `nibble - 8`, in value order.
#[cfg(test)]
pub(crate) fn widen(nibbles: &[u8]) -> Vec<i8> {
    let mut out = vec![0; nibbles.len() * 2];
    for (q, o) in nibbles
        .chunks_exact(NIBBLES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        widen_block(q, o.try_into().expect("a block"));
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BLOCK, NIBBLES};
    use crate::cpu::kernels::q8::avx2::{dot_with, products};
    use half::f16;
    use std::arch::x86_64::*;

    /// Block `b`'s eight lane sums as floats: its 16 bytes of nibbles widened to 32 bytes
    /// `nibble - 8` (low nibbles in the lower half, high in the upper: value order), then
    /// `Q8_0`'s products.
    ///
    /// # Safety
    /// The CPU has AVX2, and block `b` of both rows is in bounds.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes(wq: &[u8], xq: &[i8], b: usize) -> __m256 {
        // SAFETY: the caller keeps block `b` of both rows in bounds.
        unsafe {
            let packed = _mm_loadu_si128(wq.as_ptr().add(b * NIBBLES).cast());
            let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
            let nibbles = _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
            let w = _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
            products(w, _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast()))
        }
    }

    /// [`super::dot_reference`] in AVX2: `Q8_0`'s sum of these lanes.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(wq: &[u8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
        let kb = ws.len();
        assert!(wq.len() >= kb * NIBBLES && xq.len() >= kb * BLOCK && xd.len() >= kb);
        // SAFETY: blocks `< kb` of both rows are in bounds (asserted).
        unsafe { dot_with(ws, xd, |b| lanes(wq, xq, b)) }
    }
}

#[cfg(test)]
mod tests;
