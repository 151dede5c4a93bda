//! Five-bit weights for decoding: GGUF's `Q5_0` (blocks of 32 values along a weight row, one
//! f16 scale each; a value's low four bits as `Q4_0`'s nibbles, its fifth bit in the block's
//! 32-bit word of high bits: value = `(q - 16) · d`), multiplied by the activations quantised as
//! for `Q8_0` ([`q8::Q8Rows`]).
//!
//! 0.6875 bytes a weight. llama.cpp writes the matrices of a "Q4_K_M" file in `Q5_0` where their
//! rows are not a multiple of 256 long (SmolLM2-135M's 576, 360M's 960). As with `Q4_0`, each
//! block's lane sums are those of its values widened to the bytes `q - 16`, exact in integers,
//! and the rest is `Q8_0`'s product: a row times an activation row is, bit for bit,
//! [`q8::dot_reference`] of the widened bytes, which the tests check for each kernel. AVX2 sets
//! the fifth bits from the word and takes `Q8_0`'s byte products; AVX-512 VNNI keeps `q`
//! unsigned into `dpbusd`, four blocks' values `0..16` or `16..32` a register, each lane
//! starting from `-Σ 16 · x` ([`super::quads`]), the fifth bits set by a byte mask made with
//! BITALG where the CPU has it.

pub(crate) use crate::arch::quants::quantize_q5_0 as quantize_block;
use half::f16;

use super::blocks::{self, BlockMatrix, Method, each_row};
use super::prefill::Unpack;
use super::q8::{self, BLOCK, Q8Rows};
use super::rows::F32Rows;

/// Bytes of a block's low nibbles (value `i` in byte `i mod 16`, the low nibble for the first
/// 16: `Q4_0`'s layout).
const NIBBLES: usize = BLOCK / 2;

/// A matrix `[rows, cols]` of `Q5_0` blocks along each row (`cols` a multiple of [`BLOCK`]),
/// stored row after row as the row's f16 scales (`cols / 32`), its words of high bits
/// (`cols / 32`, two `f16` slots each) and its low nibbles (`cols / 2` bytes): a thread's share
/// of a token's product is one stream of reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct Q5Matrix {
    pub rows: usize,
    pub cols: usize,
    data: Vec<f16>,
}

/// A row: its low nibbles `[cols / 2]`, its words of high bits `[cols / 32]` (bit `i` of a
/// block's little-endian word is value `i`'s fifth bit; bytes, since a row's words need not be
/// aligned) and its scales `[cols / 32]`.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub nibbles: &'a [u8],
    pub high: &'a [[u8; 4]],
    pub scales: &'a [f16],
}

impl Row<'_> {
    /// Block `b`'s word of high bits.
    fn high(&self, b: usize) -> u32 {
        u32::from_le_bytes(self.high[b])
    }
}

/// One block of 32 values as GGUF's `Q5_0` stores it: its f16 scale, its word of fifth bits
/// (bit `i` for value `i`) and 16 bytes of low nibbles (`Q4_0`'s order), as the decoder's
/// `--weights q5_0` holds it and `export --dtype q5_0` writes it.
pub fn q5_0_block(x: &[f32; BLOCK]) -> (f16, u32, [u8; NIBBLES]) {
    let mut q = [0; NIBBLES];
    let (d, high) = quantize_block(x, &mut q);
    (d, high, q)
}

impl Q5Matrix {
    /// `values [rows, cols]` quantised row by row by [`quantize_block`].
    pub(crate) fn from_rows(values: &[f32], cols: usize) -> Self {
        assert!(cols.is_multiple_of(BLOCK), "a Q5_0 row is whole blocks");
        let rows = values.len() / cols;
        let mut m = Self {
            rows,
            cols,
            data: vec![f16::ZERO; rows * Self::stride(cols)],
        };
        for (j, values) in values.chunks_exact(cols).enumerate() {
            let (nibbles, high, scales) = m.row_mut(j);
            let blocks = values
                .chunks_exact(BLOCK)
                .zip(nibbles.chunks_exact_mut(NIBBLES));
            for ((x, q), (d, h)) in blocks.zip(scales.iter_mut().zip(high)) {
                let (scale, word) = quantize_block(x, q);
                (*d, *h) = (scale, word.to_le_bytes());
            }
        }
        m
    }

    /// A file's `Q5_0` tensor of `rows` rows of `cols` as it stores it (blocks of an f16 scale,
    /// a word of fifth bits and 16 bytes of nibbles); `None` where it does not fit.
    pub(crate) fn from_gguf(bytes: &[u8], rows: usize, cols: usize) -> Option<Self> {
        let fits = cols > 0 && cols.is_multiple_of(BLOCK);
        if !fits || bytes.len() != rows * cols / BLOCK * 22 {
            return None;
        }
        let mut m = Self {
            rows,
            cols,
            data: vec![f16::ZERO; rows * Self::stride(cols)],
        };
        for (j, row) in bytes.chunks_exact(cols / BLOCK * 22).enumerate() {
            let (nibbles, high, scales) = m.row_mut(j);
            let blocks = row.chunks_exact(22).zip(nibbles.chunks_exact_mut(NIBBLES));
            for ((block, q), (d, h)) in blocks.zip(scales.iter_mut().zip(high)) {
                *d = f16::from_le_bytes([block[0], block[1]]);
                h.copy_from_slice(&block[2..6]);
                q.copy_from_slice(&block[6..]);
            }
        }
        Some(m)
    }

    /// A linear layer's weight `w [n_in, n_out]` (Burn's layout) as `n_out` rows of `n_in`.
    pub(crate) fn from_columns(w: &[f32], n_in: usize) -> Self {
        Self::from_rows(&F32Rows::from_columns(w, n_in).w, n_in)
    }

    /// Bytes it holds: GGUF's 22 a block (16 of nibbles, 4 of high bits, 2 of scale).
    pub(crate) fn bytes(&self) -> usize {
        2 * self.data.len()
    }

    /// `f16` slots a row of `cols` takes: 11 a block.
    fn stride(cols: usize) -> usize {
        cols / BLOCK * 11
    }

    /// Row `j`.
    #[inline]
    pub(crate) fn row(&self, j: usize) -> Row<'_> {
        let (kb, stride) = (self.cols / BLOCK, Self::stride(self.cols));
        let (scales, rest) = self.data[j * stride..(j + 1) * stride].split_at(kb);
        let bytes = rest.as_ptr().cast::<u8>();
        // SAFETY: `rest` is `10 · kb` initialised `f16`s, `20 · kb` bytes: the words' `4 · kb`,
        // then the nibbles' `16 · kb`; `u8` and `[u8; 4]` have no alignment and every bit
        // pattern is a value.
        let (high, nibbles) = unsafe {
            (
                std::slice::from_raw_parts(bytes.cast::<[u8; 4]>(), kb),
                std::slice::from_raw_parts(bytes.add(4 * kb), 16 * kb),
            )
        };
        Row {
            nibbles,
            high,
            scales,
        }
    }

    /// Row `j`'s nibbles, words and scales, to write.
    pub(crate) fn row_mut(&mut self, j: usize) -> (&mut [u8], &mut [[u8; 4]], &mut [f16]) {
        let (kb, stride) = (self.cols / BLOCK, Self::stride(self.cols));
        let (scales, rest) = self.data[j * stride..(j + 1) * stride].split_at_mut(kb);
        let bytes = rest.as_mut_ptr().cast::<u8>();
        // SAFETY: as in `row`; the two slices do not overlap and `rest` is borrowed mutably
        // once, here.
        let (high, nibbles) = unsafe {
            (
                std::slice::from_raw_parts_mut(bytes.cast::<[u8; 4]>(), kb),
                std::slice::from_raw_parts_mut(bytes.add(4 * kb), 16 * kb),
            )
        };
        (nibbles, high, scales)
    }

    /// Row `j`'s values `(q - 16) · d` into `out` `[cols]` (ggml's `dequantize_row_q5_0`).
    pub(crate) fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        let row = self.row(j);
        let mut widened = [0i8; BLOCK];
        for (b, values) in out.chunks_exact_mut(BLOCK).enumerate() {
            let d = row.scales[b].to_f32();
            widen_block(row, b, &mut widened);
            values
                .iter_mut()
                .zip(widened)
                .for_each(|(v, q)| *v = f32::from(q) * d);
        }
    }
}

impl Unpack for Q5Matrix {
    const GROUP: usize = BLOCK;
    const ZERO: i32 = 16;
    const MINIMUMS: bool = false;
    const LARGEST: u8 = 31;

    fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Each value's nibble and fifth bit as a byte, `d`.
    fn unpack_row(&self, j: usize, u: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
        let row = self.row(j);
        for (b, (u, s)) in u.chunks_exact_mut(BLOCK).zip(scales).enumerate() {
            let (nibbles, high) = (&row.nibbles[b * NIBBLES..(b + 1) * NIBBLES], row.high(b));
            let fifth = |i: usize| (((high >> i) & 1) << 4) as u8;
            for (i, &n) in nibbles.iter().enumerate() {
                u[i] = (n & 0x0F) | fifth(i);
                u[i + NIBBLES] = (n >> 4) | fifth(i + NIBBLES);
            }
            *s = row.scales[b].to_f32();
        }
    }
}

impl BlockMatrix for Q5Matrix {
    type Row<'a> = Row<'a>;

    fn shape(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    #[inline]
    fn row(&self, j: usize) -> Row<'_> {
        Q5Matrix::row(self, j)
    }

    fn dequantise_row(&self, j: usize, out: &mut [f32]) {
        Q5Matrix::dequantise_row(self, j, out)
    }
}

/// `out [rows, w.rows] = x [rows, w.cols] · wᵀ + b` by `method` ([`blocks::product`]).
pub(crate) fn product(out: &mut [f32], x: &[f32], w: &Q5Matrix, b: &[f32], method: Method) {
    blocks::product(out, x, w, b, method, kernel())
}

/// Outputs `j0..j0 + out.len()` of one quantised row `x` times `wᵀ` plus `b`: a thread's share
/// of a token's product.
pub(crate) fn row_range(out: &mut [f32], x: &Q8Rows, w: &Q5Matrix, b: &[f32], j0: usize) {
    (kernel().rows)(out, x, w, b, j0)
}

type Kernel = blocks::Kernel<Q5Matrix>;

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
        dot: |w, x| dot_reference(w, x.q, x.d),
        rows: |out, x, w, b, j0| each_row(out, x, w, b, j0, |w, x| dot_reference(w, x.q, x.d)),
    };
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (all six): `runnable` keeps a kernel only where the CPU has the features it
        // is compiled for, and BITALG's only where the CPU has it too.
        let avx512 = Kernel {
            name: "avx512-vnni",
            dot: |w, x| unsafe { avx512::one(w, x.q, x.d) },
            rows: |out, x, w, b, j0| unsafe { avx512::row_range(out, x, w, b, j0) },
        };
        let bitalg = Kernel {
            name: "avx512-vnni-bitalg",
            dot: |w, x| unsafe { avx512::one_bitalg(w, x.q, x.d) },
            rows: |out, x, w, b, j0| unsafe { avx512::row_range_bitalg(out, x, w, b, j0) },
        };
        let avx2 = Kernel {
            name: "avx2",
            dot: |w, x| unsafe { avx2::dot(w, x.q, x.d) },
            rows: |out, x, w, b, j0| unsafe { avx2::row_range(out, x, w, b, j0) },
        };
        let mut all = blocks::runnable(avx512, avx2, reference);
        let vnni = blocks::vector_sets().0;
        if vnni && std::arch::is_x86_feature_detected!("avx512bitalg") {
            all.insert(0, bitalg);
        }
        all
    }
    #[cfg(not(target_arch = "x86_64"))]
    vec![reference]
}

/// The numbers every kernel computes: [`q8::dot_reference`] of the row's widened bytes. CPUs
/// without AVX2 run it, so it widens a block at a time and allocates nothing.
pub(crate) fn dot_reference(w: Row<'_>, xq: &[i8], xd: &[f32]) -> f32 {
    q8::dot_reference_with(w.scales, xq, xd, |b, out| widen_block(w, b, out))
}

/// Block `b`'s values as the 32 bytes `q - 16`, in value order.
fn widen_block(w: Row<'_>, b: usize, out: &mut [i8; BLOCK]) {
    let (nibbles, high) = (&w.nibbles[b * NIBBLES..(b + 1) * NIBBLES], w.high(b));
    let fifth = |i: usize| (((high >> i) & 1) << 4) as u8;
    for (i, &n) in nibbles.iter().enumerate() {
        out[i] = ((n & 0x0F) | fifth(i)) as i8 - 16;
        out[i + NIBBLES] = ((n >> 4) | fifth(i + NIBBLES)) as i8 - 16;
    }
}

#[cfg(target_arch = "x86_64")]
pub(in crate::cpu::kernels) mod avx2 {
    use super::{BLOCK, Row};
    use crate::cpu::kernels::q4_0::avx2::nibbles;
    use crate::cpu::kernels::q8::avx2::{dot_with, products};
    use std::arch::x86_64::*;

    /// Block `b`'s eight lane sums as floats: its values widened to the bytes `q - 16` (the
    /// nibbles, the fifth bits spread from the word to a byte each, as ggml's
    /// `bytes_from_bits_32`: a byte whose bit is clear gets `0xF0`, which makes the byte
    /// `nibble - 16`), then `Q8_0`'s products.
    ///
    /// # Safety
    /// The CPU has AVX2, and block `b` of both rows is in bounds.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lanes(w: Row<'_>, xq: &[i8], b: usize) -> __m256 {
        // SAFETY: the caller keeps block `b` of both rows in bounds.
        unsafe {
            let set = bit_bytes(u32::from_le_bytes(*w.high.get_unchecked(b)));
            let w = _mm256_or_si256(
                nibbles(w.nibbles, b),
                _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8)),
            );
            products(w, _mm256_loadu_si256(xq.as_ptr().add(b * BLOCK).cast()))
        }
    }

    /// The 32 bits of `word` as 32 bytes, all ones where bit `i` is set (byte `i`).
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::cpu::kernels) fn bit_bytes(word: u32) -> __m256i {
        // Byte `i` of the word's copy picks byte `i / 8` of the bits, then every bit but
        // `i mod 8` is set: the byte is all ones where value `i`'s fifth bit is.
        let spread = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
        let bits = _mm256_shuffle_epi8(_mm256_set1_epi32(word as i32), spread);
        _mm256_cmpeq_epi8(_mm256_or_si256(bits, others), _mm256_set1_epi8(-1))
    }

    /// [`super::dot_reference`] in AVX2: `Q8_0`'s sum of these lanes.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(w: Row<'_>, xq: &[i8], xd: &[f32]) -> f32 {
        let kb = w.scales.len();
        assert!(w.nibbles.len() >= kb * BLOCK / 2 && w.high.len() >= kb);
        assert!(xq.len() >= kb * BLOCK && xd.len() >= kb);
        // SAFETY: blocks `< kb` of both rows are in bounds (asserted).
        unsafe { dot_with(w.scales, xd, |b| lanes(w, xq, b)) }
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
        w: &super::Q5Matrix,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot(w, x.q, x.d) })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{BLOCK, Row};
    use crate::cpu::kernels::quads::avx512::{Quads, dot, nibbles};
    use std::arch::x86_64::*;

    /// Blocks `b..b + n`'s values `q` in [`Quads`]' order: the nibbles with `0x10` added where
    /// the blocks' words of high bits say, each byte's bit picked from its block's word by
    /// `vpshufbitqmb` (`BITALG`), or else by a byte shuffle and a test.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW (and BITALG with `BITALG`), and blocks `b..b + n` (`n` in
    /// `1..=4`) are in the row. Inlined always, with no features of its own, so that it is
    /// compiled with its caller's (BITALG's entries have it: see [`row_range_bitalg`]).
    #[inline(always)]
    unsafe fn group<const BITALG: bool>(w: Row<'_>, b: usize, n: usize) -> [__m512i; 2] {
        // SAFETY: the caller keeps blocks `b..b + n` in bounds; a short group's load is masked.
        let ([low, high], words) = unsafe {
            let at = w.high.as_ptr().add(b).cast();
            let words = match n {
                4 => _mm_loadu_si128(at),
                _ => _mm_maskz_loadu_epi32((1u8 << n) - 1, at.cast()),
            };
            (nibbles(w.nibbles, b, n), words)
        };
        // SAFETY: the CPU has AVX-512 F and BW, and BITALG with `BITALG` (the caller's word).
        unsafe {
            let sixteen = _mm512_set1_epi8(0x10);
            let add = |q: __m512i, bits: __mmask64| _mm512_mask_add_epi8(q, bits, q, sixteen);
            let [first, second] = match BITALG {
                true => bits_bitalg(words),
                false => bits_bw(words),
            };
            [add(low, first), add(high, second)]
        }
    }

    /// The masks of fifth bits of a group's two registers (bit `i` for byte `i`) from its four
    /// words `[w0, w1, w2, w3]`: `vpshufbitqmb` picks each byte's bit from its 64-bit lane,
    /// lanes `2i` and `2i + 1` holding block `i`'s word (the low half of `w0 | w1 << 32` for
    /// even blocks, the high half for odd ones).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bitalg")]
    fn bits_bitalg(words: __m128i) -> [__mmask64; 2] {
        let pairs = _mm512_permutexvar_epi64(
            _mm512_setr_epi64(0, 0, 0, 0, 1, 1, 1, 1),
            _mm512_castsi128_si512(words),
        );
        let (even, odd) = (0x0706_0504_0302_0100, 0x2726_2524_2322_2120);
        let (even8, odd8) = (even + 0x0808_0808_0808_0808, odd + 0x0808_0808_0808_0808);
        let first = _mm512_set_epi64(odd8, odd, even8, even, odd8, odd, even8, even);
        let second = _mm512_add_epi8(first, _mm512_set1_epi8(16));
        [
            _mm512_bitshuffle_epi64_mask(pairs, first),
            _mm512_bitshuffle_epi64_mask(pairs, second),
        ]
    }

    /// [`bits_bitalg`] with AVX-512 BW alone: each 128-bit lane gets its block's word, each
    /// byte the word's byte that holds its value's bit (bytes 0 and 1 for values `0..16`, 2 and
    /// 3 for `16..32`), and a test of that bit.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn bits_bw(words: __m128i) -> [__mmask64; 2] {
        let words = _mm512_permutexvar_epi32(
            _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
            _mm512_castsi128_si512(words),
        );
        let bit = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
        let test = |first: i64| {
            let (pair, next) = (
                first * 0x0101_0101_0101_0101,
                (first + 1) * 0x0101_0101_0101_0101,
            );
            let bytes = _mm512_set_epi64(next, pair, next, pair, next, pair, next, pair);
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(words, bytes), bit)
        };
        [test(0), test(2)]
    }

    /// [`super::dot_reference`] with AVX-512 VNNI, of activations laid out as [`Quads`] (made
    /// with zero 16).
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C, and BITALG with `BITALG`
    /// (the lengths are asserted). Inlined always, as [`group`].
    #[inline(always)]
    unsafe fn dot_quads<const BITALG: bool>(w: Row<'_>, xd: &[f32], x: &Quads) -> f32 {
        let kb = w.scales.len();
        assert!(w.nibbles.len() >= kb * BLOCK / 2 && w.high.len() >= kb);
        // SAFETY: `dot` asks for `kb` blocks of `x` and `xd` (it asserts them) and calls
        // `group` for blocks `< kb` only, in bounds (asserted).
        unsafe { dot(w.scales, xd, x, |b, n| group::<BITALG>(w, b, n)) }
    }

    /// A kernel's two entries, `$one` ([`super::dot_reference`]: the activations laid out,
    /// then [`dot_quads`]) and `$rows` ([`super::row_range`]: the activations laid out once for
    /// the share's rows), compiled with `$features` (BITALG's bits with `$bitalg`). A macro:
    /// the features are a function's own, and a function made generic over them would lose
    /// BITALG's inlining (a closure made in a function without the feature is compiled
    /// without it).
    macro_rules! entries {
        ($one:ident, $rows:ident, $bitalg:literal, $features:literal) => {
            /// # Safety
            /// The CPU has every feature named.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $one(w: Row<'_>, xq: &[i8], xd: &[f32]) -> f32 {
                let quads = Quads::new(&xq[..w.scales.len() * BLOCK], 16);
                // SAFETY: this function has the features `dot_quads` asks for.
                unsafe { dot_quads::<$bitalg>(w, xd, &quads) }
            }

            /// # Safety
            /// The CPU has every feature named.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $rows(
                out: &mut [f32],
                x: &super::Q8Rows,
                w: &super::Q5Matrix,
                b: &[f32],
                j0: usize,
            ) {
                let quads = Quads::new(&x.one().q[..w.cols], 16);
                // SAFETY: this function has the features `dot_quads` asks for.
                super::each_row(out, x, w, b, j0, |w, x| unsafe {
                    dot_quads::<$bitalg>(w, x.d, &quads)
                })
            }
        };
    }

    entries!(
        one,
        row_range,
        false,
        "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
    );
    entries!(
        one_bitalg,
        row_range_bitalg,
        true,
        "avx512f,avx512bw,avx512vl,avx512vnni,avx512bitalg,avx2,fma,f16c"
    );
}

#[cfg(test)]
mod tests;
