//! `Q4_1`: 20 bytes for 32 values: `d` and `m` (f16), 16 bytes of nibbles (value `i` the low
//! nibble of byte `i`, value `i + 16` its high nibble); value = `d · q + m`. `Q5_1` (24 bytes)
//! adds a 32-bit word of fifth bits after `m` (bit `i` for value `i`, `q` up to 31), as `Q5_0`.
//!
//! A block's product with an activation block `x = xd · xq` is
//! `xd · d · Σ q · xq + xd · m · Σ xq`: the first sum in lanes as `Q8_0`'s, the second from the
//! block's sum of bytes kept with the activations; [`Sets`] holds `− xd · m` as the minimum's
//! scale, so that its total adds it.

use super::super::blocks::each_row;
use super::super::q8::{BLOCK, Q8Rows, XRow};
use super::{KMatrix, KType, Sets, half, lanes};
use crate::arch::BlockType;

/// `Q4_1` (`FIVE` false) and `Q5_1`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Offsets<const FIVE: bool>;

/// `Q4_1`.
pub(crate) type Q41 = Offsets<false>;
/// `Q5_1`.
pub(crate) type Q51 = Offsets<true>;

/// A `Q4_1` matrix.
pub(crate) type Q41Matrix = KMatrix<Q41>;
/// A `Q5_1` matrix.
pub(crate) type Q51Matrix = KMatrix<Q51>;

/// Where a block's parts are: `d`, `m`, `Q5_1`'s word of fifth bits.
const D: usize = 0;
const M: usize = 2;
const QH: usize = 4;

impl<const FIVE: bool> Offsets<FIVE> {
    /// Where the nibbles start.
    const QS: usize = if FIVE { 8 } else { 4 };

    /// Value `i`'s `q`.
    #[inline]
    fn q(block: &[u8], i: usize) -> u8 {
        let byte = block[Self::QS + i % 16];
        let nibble = if i < 16 { byte & 0x0F } else { byte >> 4 };
        match FIVE {
            true => {
                let word =
                    u32::from_le_bytes([block[QH], block[QH + 1], block[QH + 2], block[QH + 3]]);
                nibble | ((((word >> i) & 1) as u8) << 4)
            }
            false => nibble,
        }
    }
}

impl<const FIVE: bool> KType for Offsets<FIVE> {
    const VALUES: usize = BLOCK;
    const BYTES: usize = if FIVE { 24 } else { 20 };
    const MINIMUMS: bool = true;
    const LARGEST: u8 = if FIVE { 31 } else { 15 };

    /// Bytes `q`, scale `d`, minimum `m`.
    fn unpack(block: &[u8], u: &mut [u8], scales: &mut [f32], minimums: &mut [f32]) {
        for (i, u) in u.iter_mut().enumerate() {
            *u = Self::q(block, i);
        }
        (scales[0], minimums[0]) = (half(block, D), half(block, M));
    }

    fn dequantise(block: &[u8], out: &mut [f32]) {
        let kind = if FIVE {
            BlockType::Q5_1
        } else {
            BlockType::Q4_1
        };
        kind.decode(block, out);
    }
}

/// The numbers every kernel computes for a row times an activation row ([`Sets`]): block `b`'s
/// lanes of `q · xq` times `d · xd`, its activation sum times `−(m · xd)`.
pub(crate) fn dot_reference<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
    let mut sets = Sets::new();
    for (b, block) in w.chunks_exact(Offsets::<FIVE>::BYTES).enumerate() {
        let (d, m) = (half(block, D), half(block, M));
        let q = lanes(x, b, |i| i32::from(Offsets::<FIVE>::q(block, i)));
        sets.add(b, q, d * x.d[b]);
        sets.add_min(b, x.sums[b], -(m * x.d[b]));
    }
    sets.total()
}

kernels_of!(
    Q41,
    dot_reference::<false>,
    avx2::dot::<false>,
    avx2::row_range::<false>,
    avx512::dot::<false>,
    avx512::row_range::<false>
);
kernels_of!(
    Q51,
    dot_reference::<true>,
    avx2::dot::<true>,
    avx2::row_range::<true>,
    avx512::dot::<true>,
    avx512::row_range::<true>
);

/// Block `block`'s 32 values `q` in value order (AVX2), and its word of fifth bits where it has
/// one.
///
/// # Safety
/// The CPU has AVX2; `block` is a whole block.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn values<const FIVE: bool>(block: &[u8]) -> std::arch::x86_64::__m256i {
    use crate::cpu::kernels::q4_0::avx2::nibbles;
    use crate::cpu::kernels::q5_0::avx2::bit_bytes;
    use std::arch::x86_64::*;
    // SAFETY: the block's 16 bytes of nibbles are in bounds.
    let n = unsafe { nibbles(&block[Offsets::<FIVE>::QS..], 0) };
    match FIVE {
        true => {
            let word = u32::from_le_bytes([block[QH], block[QH + 1], block[QH + 2], block[QH + 3]]);
            _mm256_or_si256(n, _mm256_and_si256(bit_bytes(word), _mm256_set1_epi8(0x10)))
        }
        false => n,
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::avx2::{pairs, total};
    use super::{BLOCK, D, M, Offsets, XRow, values};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// [`super::dot_reference`] in AVX2: eight blocks' scales `d · xd` and minimums'
    /// `−(m · xd)` as vectors (the minimums into lane `b mod 8` by one multiply-add), a block's
    /// values by `maddubs` and `madd` into set `b mod 4`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
        let bytes = Offsets::<FIVE>::BYTES;
        let n = w.len() / bytes;
        assert!(x.q.len() >= n * BLOCK && x.d.len() >= n && x.sums.len() >= n);
        let mut sets = [_mm256_setzero_ps(); 4];
        let mut mins = _mm256_setzero_ps();
        let ones = _mm256_set1_epi16(1);
        for b0 in (0..n).step_by(8) {
            let count = (n - b0).min(8);
            // Absent blocks of a last part of eight: scales, minimums and sums of zero, which
            // add nothing.
            let (mut halves, mut xd, mut sums) = ([[0u16; 8]; 2], [0f32; 8], [0f32; 8]);
            for i in 0..count {
                let block = &w[(b0 + i) * bytes..];
                halves[0][i] = u16::from_le_bytes([block[D], block[D + 1]]);
                halves[1][i] = u16::from_le_bytes([block[M], block[M + 1]]);
            }
            xd[..count].copy_from_slice(&x.d[b0..b0 + count]);
            sums[..count].copy_from_slice(&x.sums[b0..b0 + count]);
            let mut each = [0f32; 8];
            // SAFETY: the arrays are eight wide; the blocks read are in bounds (asserted).
            unsafe {
                let xd = _mm256_loadu_ps(xd.as_ptr());
                let d = _mm256_cvtph_ps(_mm_loadu_si128(halves[0].as_ptr().cast()));
                let m = _mm256_cvtph_ps(_mm_loadu_si128(halves[1].as_ptr().cast()));
                _mm256_storeu_ps(each.as_mut_ptr(), _mm256_mul_ps(d, xd));
                let negated = _mm256_xor_ps(_mm256_mul_ps(m, xd), _mm256_set1_ps(-0.0));
                mins = _mm256_fmadd_ps(_mm256_loadu_ps(sums.as_ptr()), negated, mins);
                for (i, &scale) in each.iter().enumerate().take(count) {
                    let b = b0 + i;
                    let block = &w[b * bytes..(b + 1) * bytes];
                    let x8 = _mm256_loadu_si256(x.q.as_ptr().add(b * BLOCK).cast());
                    let products = _mm256_madd_epi16(pairs(values::<FIVE>(block), x8), ones);
                    let set = b % 4;
                    sets[set] = _mm256_fmadd_ps(
                        _mm256_cvtepi32_ps(products),
                        _mm256_set1_ps(scale),
                        sets[set],
                    );
                }
            }
        }
        total(sets, mins)
    }

    /// [`super::super::row_range`], compiled with the kernel's features so that [`dot`] is inlined.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_range<const FIVE: bool>(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::super::KMatrix<Offsets<FIVE>>,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot::<FIVE>(w, x) })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::avx512::{pair_scale, total};
    use super::{BLOCK, D, M, Offsets, QH, XRow};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// Blocks `b` and `b + 1`'s values in one register (`two` false: block `b`'s, the upper
    /// half zero): their nibbles, with 16 added where `Q5_1`'s words (one 64-bit byte mask)
    /// say.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW; the blocks read are in `w`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx2")]
    unsafe fn pair<const FIVE: bool>(w: &[u8], b: usize, two: bool) -> __m512i {
        let bytes = Offsets::<FIVE>::BYTES;
        let qs = Offsets::<FIVE>::QS;
        let mask = _mm512_set1_epi8(0x0F);
        // SAFETY: the caller keeps the blocks read in `w`.
        unsafe {
            let at = |b: usize| w.as_ptr().add(b * bytes);
            let nibbles = |b: usize| {
                let q = _mm_loadu_si128(at(b).add(qs).cast());
                _mm256_set_m128i(_mm_srli_epi16(q, 4), q)
            };
            let n = match two {
                true => _mm512_inserti64x4(_mm512_castsi256_si512(nibbles(b)), nibbles(b + 1), 1),
                false => _mm512_zextsi256_si512(nibbles(b)),
            };
            let n = _mm512_and_si512(n, mask);
            match FIVE {
                true => {
                    let word = |b: usize| u64::from(at(b).add(QH).cast::<u32>().read_unaligned());
                    let high = word(b) | if two { word(b + 1) << 32 } else { 0 };
                    _mm512_mask_add_epi8(n, high, n, _mm512_set1_epi8(0x10))
                }
                false => n,
            }
        }
    }

    /// [`super::dot_reference`] with AVX-512 VNNI: eight blocks' scales `d · xd` and minimums'
    /// `−(m · xd)` as vectors (the minimums into lane `b mod 8` by one multiply-add), two
    /// blocks' values in one register, unsigned into `dpbusd` against their 64 activation
    /// bytes.
    ///
    /// # Safety
    /// The CPU has every feature named below (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
        let bytes = Offsets::<FIVE>::BYTES;
        let n = w.len() / bytes;
        assert!(x.q.len() >= n * BLOCK && x.d.len() >= n && x.sums.len() >= n);
        let (mut low, mut high) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut mins = _mm256_setzero_ps();
        for b0 in (0..n).step_by(8) {
            let count = (n - b0).min(8);
            let mut halves = [[0u16; 8]; 2];
            for i in 0..count {
                let block = &w[(b0 + i) * bytes..];
                halves[0][i] = u16::from_le_bytes([block[D], block[D + 1]]);
                halves[1][i] = u16::from_le_bytes([block[M], block[M + 1]]);
            }
            let lanes = ((1u32 << count) - 1) as u8;
            // SAFETY: the masked loads read blocks `b0..b0 + count`, in bounds (asserted);
            // the blocks `pair` reads are in `w`.
            unsafe {
                let xd = _mm256_maskz_loadu_ps(lanes, x.d.as_ptr().add(b0));
                let sums = _mm256_maskz_loadu_ps(lanes, x.sums.as_ptr().add(b0));
                let d = _mm256_cvtph_ps(_mm_loadu_si128(halves[0].as_ptr().cast()));
                let m = _mm256_cvtph_ps(_mm_loadu_si128(halves[1].as_ptr().cast()));
                let scales = _mm256_mul_ps(d, xd);
                let negated = _mm256_xor_ps(_mm256_mul_ps(m, xd), _mm256_set1_ps(-0.0));
                mins = _mm256_fmadd_ps(sums, negated, mins);
                let mut i = 0;
                while i < count {
                    let two = i + 1 < count;
                    let q = pair::<FIVE>(w, b0 + i, two);
                    let xs = match two {
                        true => _mm512_loadu_si512(x.q.as_ptr().add((b0 + i) * BLOCK).cast()),
                        false => _mm512_zextsi256_si512(_mm256_loadu_si256(
                            x.q.as_ptr().add((b0 + i) * BLOCK).cast(),
                        )),
                    };
                    let products = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xs);
                    let step = _mm512_fmadd_ps(
                        _mm512_cvtepi32_ps(products),
                        pair_scale(scales, i),
                        match i % 4 {
                            0 => low,
                            _ => high,
                        },
                    );
                    // Blocks `4k`, `4k + 1` are sets 0 and 1; `4k + 2`, `4k + 3` sets 2 and 3.
                    match i % 4 {
                        0 => low = step,
                        _ => high = step,
                    }
                    i += 2;
                }
            }
        }
        total(low, high, mins)
    }

    /// [`super::super::row_range`], compiled with the kernel's features so that [`dot`] is inlined.
    ///
    /// # Safety
    /// The CPU has every feature named below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn row_range<const FIVE: bool>(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::super::KMatrix<Offsets<FIVE>>,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot::<FIVE>(w, x) })
    }
}
