//! Four-bit weights for decoding: GGUF's `Q4_0` (blocks of 32 values along a weight row, one
//! f16 scale each, the values as nibbles: value = `(nibble - 8) · d`), multiplied by the same
//! quantised activations as `Q8_0`'s ([`q8::Q8Rows`]: blocks of 32 signed bytes, an f32 scale).
//!
//! 0.5625 bytes a weight against `Q8_0`'s 1.0625: a token of decoding reads about half the
//! bytes. Each block's eight lane sums (four products each) are those of its nibbles widened
//! to the bytes `nibble - 8`, exact in integers, and from there the product is `Q8_0`'s: the
//! same lanes, the same sums in the same order. So a `Q4_0` row times an activation row is,
//! bit for bit, [`q8::dot_reference`] of its widened bytes, which the tests check for each
//! kernel: AVX2 widens in registers and takes `Q8_0`'s byte products; AVX-512 VNNI keeps the
//! nibbles unsigned (`dpbusd`'s first operand), four blocks' low or high nibbles a register,
//! each lane starting from `-Σ 8 · x` ([`super::quads`]). A product of many rows (a prompt)
//! multiplies the dequantised weights in f32, as `Q8_0`'s does.

pub(crate) use crate::arch::quants::quantize_q4_0 as quantize_block;
use half::f16;

use super::blocks::{self, BlockMatrix, Method, each_row};
use super::prefill::Unpack;
use super::q8::{self, BLOCK, Q8Rows};
use super::rows::F32Rows;

/// Bytes of a block's nibbles: value `i` (of 32) in byte `i mod 16`, the low nibble for the
/// first 16, the high for the rest (ggml's layout).
const NIBBLES: usize = BLOCK / 2;

/// A matrix `[rows, cols]` of `Q4_0` blocks along each row (`cols` a multiple of [`BLOCK`]),
/// stored row after row as the row's f16 scales (`cols / 32`) and then its nibbles (`cols / 2`
/// bytes, four to an `f16` slot): a thread's share of a token's product is one stream of
/// reads, as `Q8_0`'s is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Q4Matrix {
    pub rows: usize,
    pub cols: usize,
    data: Vec<f16>,
}

/// One block of 32 values as GGUF's `Q4_0` stores it: its f16 scale and 16 bytes of nibbles
/// (value `i` in byte `i mod 16`, the low nibble for the first 16), as the decoder's
/// `--weights q4_0` holds it and `export --dtype q4_0` writes it.
pub fn q4_0_block(x: &[f32; BLOCK]) -> (f16, [u8; NIBBLES]) {
    let mut q = [0; NIBBLES];
    let d = quantize_block(x, &mut q);
    (d, q)
}

impl Q4Matrix {
    /// `values [rows, cols]` quantised row by row by [`quantize_block`].
    /// A file's `Q4_0` tensor of `rows` rows of `cols` as it stores it (blocks of an f16 scale
    /// and 16 bytes of nibbles, in this layout's order); `None` where it does not fit.
    pub(crate) fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let fits = cols > 0 && cols.is_multiple_of(BLOCK);
        if !fits || bytes.len() != rows * cols / BLOCK * (2 + NIBBLES) {
            return None;
        }
        let mut m = Self {
            rows,
            cols,
            data: vec![f16::ZERO; rows * (cols / BLOCK + cols / 4)],
        };
        for (j, row) in bytes.chunks_exact(cols / BLOCK * (2 + NIBBLES)).enumerate() {
            let (q, d) = m.row_mut(j);
            let blocks = row
                .chunks_exact(2 + NIBBLES)
                .zip(q.chunks_exact_mut(NIBBLES));
            for ((block, q), d) in blocks.zip(d) {
                *d = f16::from_le_bytes([block[0], block[1]]);
                q.copy_from_slice(&block[2..]);
            }
        }
        Some(m)
    }

    pub(crate) fn from_rows(values: &[f32], cols: usize) -> Self {
        assert!(cols.is_multiple_of(BLOCK), "a Q4_0 row is whole blocks");
        let rows = values.len() / cols;
        let mut m = Self {
            rows,
            cols,
            data: vec![f16::ZERO; rows * (cols / BLOCK + cols / 4)],
        };
        for (j, values) in values.chunks_exact(cols).enumerate() {
            let (q, d) = m.row_mut(j);
            for ((x, q), d) in values
                .chunks_exact(BLOCK)
                .zip(q.chunks_exact_mut(NIBBLES))
                .zip(d)
            {
                *d = quantize_block(x, q);
            }
        }
        m
    }

    /// A linear layer's weight `w [n_in, n_out]` (Burn's layout) as `n_out` rows of `n_in`.
    pub(crate) fn from_columns(w: &[f32], n_in: usize) -> Self {
        Self::from_rows(&F32Rows::from_columns(w, n_in).w, n_in)
    }

    /// Bytes it holds: half a byte a weight and two a block's scale.
    pub(crate) fn bytes(&self) -> usize {
        2 * self.data.len()
    }

    /// Row `j`'s slots: its scales, then its nibbles.
    fn slots(&self, j: usize) -> std::ops::Range<usize> {
        let stride = self.cols / BLOCK + self.cols / 4;
        j * stride..(j + 1) * stride
    }

    /// Row `j`: its nibbles `[cols / 2]` and its blocks' scales `[cols / 32]`.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> (&[u8], &[f16]) {
        let (d, q) = self.data[self.slots(j)].split_at(self.cols / BLOCK);
        // SAFETY: `q` is `cols / 4` initialised `f16`s, `cols / 2` bytes; `u8` has no
        // alignment and every bit pattern is a value.
        let q = unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), self.cols / 2) };
        (q, d)
    }

    /// [`Self::row`], to write.
    pub(crate) fn row_mut(&mut self, j: usize) -> (&mut [u8], &mut [f16]) {
        let (cols, slots) = (self.cols, self.slots(j));
        let (d, q) = self.data[slots].split_at_mut(cols / BLOCK);
        // SAFETY: as in `row`, and `q` is borrowed mutably once, here.
        let q = unsafe { std::slice::from_raw_parts_mut(q.as_mut_ptr().cast::<u8>(), cols / 2) };
        (q, d)
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

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` by `method` ([`blocks::product`]).
pub(crate) fn product(out: &mut [f32], x: &[f32], w: &Q4Matrix, b: &[f32], method: Method) {
    blocks::product(out, x, w, b, method, kernel())
}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b`: a thread's share
/// of a token's product.
pub(crate) fn row_range(out: &mut [f32], x: &Q8Rows, w: &Q4Matrix, b: &[f32], j0: usize) {
    (kernel().rows)(out, x, w, b, j0)
}

/// A row: its nibbles `[cols / 2]` and its blocks' scales `[cols / 32]`.
type Row<'a> = (&'a [u8], &'a [f16]);

impl Unpack for Q4Matrix {
    const GROUP: usize = BLOCK;
    const ZERO: i32 = 8;
    const MINIMUMS: bool = false;
    const LARGEST: u8 = 15;

    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The nibbles as bytes (value order: a block's low nibbles, then its high ones), `d`.
    fn unpack_row(&self, j: usize, u: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
        let (q, d) = self.row(j);
        for ((u, q), (s, d)) in u
            .chunks_exact_mut(BLOCK)
            .zip(q.chunks_exact(NIBBLES))
            .zip(scales.iter_mut().zip(d))
        {
            let (low, high) = u.split_at_mut(NIBBLES);
            for ((l, h), &n) in low.iter_mut().zip(high).zip(q) {
                (*l, *h) = (n & 0x0F, n >> 4);
            }
            *s = d.to_f32();
        }
    }
}

impl BlockMatrix for Q4Matrix {
    type Row<'a> = Row<'a>;

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    #[inline]
    fn row(&self, j: usize) -> Row<'_> {
        Q4Matrix::row(self, j)
    }

    fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        Q4Matrix::dequantise_row(self, j, out)
    }
}

type Kernel = blocks::Kernel<Q4Matrix>;

/// The fastest exact kernel this CPU runs, chosen once.
fn kernel() -> Kernel {
    static FASTEST: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *FASTEST.get_or_init(|| kernels()[0])
}

/// Every kernel this CPU runs, fastest first; the last is the reference. Each computes the
/// same floats bit for bit.
pub(crate) fn kernels() -> Vec<Kernel> {
    let reference = Kernel {
        name: "reference",
        dot: |(wq, ws), x| dot_reference(wq, ws, x.q, x.d),
        rows: |out, x, w, b, j0| {
            each_row(out, x, w, b, j0, |(wq, ws), x| {
                dot_reference(wq, ws, x.q, x.d)
            })
        },
    };
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (all four): `runnable` keeps a kernel only where the CPU has the features it
        // is compiled for.
        let avx512 = Kernel {
            name: "avx512-vnni",
            dot: |(wq, ws), x| unsafe { avx512::dot(wq, ws, x.q, x.d) },
            rows: |out, x, w, b, j0| unsafe { avx512::row_range(out, x, w, b, j0) },
        };
        let avx2 = Kernel {
            name: "avx2",
            dot: |(wq, ws), x| unsafe { avx2::dot(wq, ws, x.q, x.d) },
            rows: |out, x, w, b, j0| unsafe { avx2::row_range(out, x, w, b, j0) },
        };
        blocks::runnable(avx512, avx2, reference)
    }
    #[cfg(not(target_arch = "x86_64"))]
    vec![reference]
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
pub(in crate::cpu::kernels) mod avx2 {
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
            let w = _mm256_sub_epi8(nibbles(wq, b), _mm256_set1_epi8(8));
            products(w, _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast()))
        }
    }

    /// Block `b`'s 16 bytes of nibbles as 32 unsigned bytes in value order (low nibbles in
    /// the lower half, high in the upper).
    ///
    /// # Safety
    /// The CPU has AVX2, and block `b` is in bounds.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) unsafe fn nibbles(wq: &[u8], b: usize) -> __m256i {
        // SAFETY: the caller keeps block `b` in bounds.
        let packed = unsafe { _mm_loadu_si128(wq.as_ptr().add(b * NIBBLES).cast()) };
        let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
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

    /// [`super::row_range`], compiled with the kernel's features so that [`dot`] is inlined
    /// into the loop over the share's rows.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_range(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::Q4Matrix,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |(wq, ws), x| unsafe {
            dot(wq, ws, x.q, x.d)
        })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::NIBBLES;
    use crate::cpu::kernels::q8::BLOCK;
    use crate::cpu::kernels::quads::avx512::{Quads, dot as quads_dot, nibbles};
    use half::f16;

    /// [`super::dot_reference`] with AVX-512 VNNI, of activations laid out as [`Quads`] (made
    /// with zero 8): the nibbles stay unsigned, as `dpbusd` wants its first operand, and each
    /// lane starts from `-Σ 8 · x`.
    ///
    /// # Safety
    /// The CPU has the features of [`dot`] (the lengths are asserted).
    #[inline(always)]
    unsafe fn dot_quads(wq: &[u8], ws: &[f16], xd: &[f32], x: &Quads) -> f32 {
        assert!(wq.len() >= ws.len() * NIBBLES);
        // SAFETY: `quads_dot` asks for `ws.len()` blocks of `x` and `xd` (it asserts them) and
        // reads blocks `< ws.len()` of `wq` only, in bounds (asserted).
        unsafe { quads_dot(ws, xd, x, |b, n| nibbles(wq, b, n)) }
    }

    /// [`super::dot_reference`] with AVX-512 VNNI: the activations laid out, then
    /// [`dot_quads`].
    ///
    /// # Safety
    /// The CPU has every feature named below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot(wq: &[u8], ws: &[f16], xq: &[i8], xd: &[f32]) -> f32 {
        let quads = Quads::new(&xq[..ws.len() * BLOCK], 8);
        // SAFETY: this function has the features `dot_quads` asks for.
        unsafe { dot_quads(wq, ws, xd, &quads) }
    }

    /// [`super::row_range`]: the activations laid out once for the share's rows.
    ///
    /// # Safety
    /// The CPU has every feature named below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn row_range(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::Q4Matrix,
        b: &[f32],
        j0: usize,
    ) {
        let quads = Quads::new(&x.one().q[..w.cols], 8);
        // SAFETY: this function has the features `dot_quads` asks for.
        super::each_row(out, x, w, b, j0, |(wq, ws), x| unsafe {
            dot_quads(wq, ws, x.d, &quads)
        })
    }
}

#[cfg(test)]
mod tests;
