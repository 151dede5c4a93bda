//! `Q6_K`: 210 bytes for 256 values: 128 bytes of low nibbles, 64 of high bit pairs, sixteen
//! signed 8-bit scales (one per 16 values) and `d` (f16). Value = `(d · sc) · (q − 32)`.
//!
//! Group `g` of 32 (half `h = g / 4`, `j = g mod 4`) takes its low four bits from bytes
//! `64h + 32(j mod 2)..` (low nibbles for `j < 2`, high ones after), its two high bits from
//! bits `2j..2j + 2` of bytes `128 + 32h..`, and its two scales from scales `8h + 2j` and
//! `8h + 2j + 1`. A lane (four values) has one scale, so a group's lanes
//! `sc · Σ (q − 32) · xq` are exact in integers and the group takes one float scale,
//! `d · xd`.

use super::super::blocks::each_row;
use super::super::q8::{BLOCK, Q8Rows, XRow};
use super::{GROUPS, KMatrix, KType, SUPER, Sets, half, lanes};
use crate::arch::BlockType;

/// The type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Q6K;

/// A `Q6_K` matrix.
pub(crate) type Q6KMatrix = KMatrix<Q6K>;

/// Where a super-block's parts are.
const QL: usize = 0;
const QH: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;

impl KType for Q6K {
    const BYTES: usize = 210;
    const GROUP: usize = 16;
    const ZERO: i32 = 32;
    const MINIMUMS: bool = false;
    const LARGEST: u8 = 63;

    /// Group `g`'s bytes `q` (`value + 32`), the scales `d · sc` of its two halves.
    fn unpack(block: &[u8], u: &mut [u8], scales: &mut [f32], _: &mut [f32]) {
        let d = half(block, D);
        for (g, u) in u.chunks_exact_mut(BLOCK).enumerate() {
            // [`value`]'s bytes as whole slices, so that the loop is vector code.
            let (h, j) = (g / 4, g % 4);
            let low = &block[QL + 64 * h + 32 * (j % 2)..][..BLOCK];
            let high = &block[QH + 32 * h..][..BLOCK];
            for ((u, &l), &hi) in u.iter_mut().zip(low).zip(high) {
                *u = ((l >> (4 * (j / 2))) & 0x0F) | (((hi >> (2 * j)) & 3) << 4);
            }
            for k in 0..2 {
                scales[2 * g + k] = d * f32::from(scale(block, g, k));
            }
        }
    }

    fn dequantise(block: &[u8], out: &mut [f32]) {
        BlockType::Q6_K.decode(block, out);
    }
}

/// Group `g`'s value `i`, `q − 32`.
#[inline]
fn value(block: &[u8], g: usize, i: usize) -> i8 {
    let (h, j) = (g / 4, g % 4);
    let low = block[QL + 64 * h + 32 * (j % 2) + i] >> (4 * (j / 2));
    let high = (block[QH + 32 * h + i] >> (2 * j)) & 3;
    ((low & 0x0F) | (high << 4)) as i8 - 32
}

/// Group `g`'s scale of its half `k` (values `16k..16k + 16`).
#[inline]
fn scale(block: &[u8], g: usize, k: usize) -> i8 {
    let (h, j) = (g / 4, g % 4);
    block[SCALES + 8 * h + 2 * j + k] as i8
}

/// The numbers every kernel computes for a row times an activation row ([`Sets`]): group
/// `b`'s lanes `sc · Σ (q − 32) · xq` times `d · xd`.
pub(crate) fn dot_reference(w: &[u8], x: XRow<'_>) -> f32 {
    let mut sets = Sets::new();
    for (s, block) in w.chunks_exact(Q6K::BYTES).enumerate() {
        let d = half(block, D);
        for g in 0..GROUPS {
            let b = s * GROUPS + g;
            let q = lanes(x, b, |i| {
                i32::from(scale(block, g, i / 16)) * i32::from(value(block, g, i))
            });
            sets.add(b, q, d * x.d[b]);
        }
    }
    sets.total()
}

kernels_of!(
    Q6K,
    dot_reference,
    avx2::dot,
    avx2::row_range,
    avx512::dot,
    avx512::row_range
);

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::avx2::{half, pairs, total};
    use super::{BLOCK, D, GROUPS, Q6K, QH, QL, SCALES, SUPER, XRow};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// Byte picks that spread a half's eight scales (as `i16`, in both 128-bit lanes) to
    /// group `j`'s: scale `2j` in the low lane's eight `i16`s, `2j + 1` in the high lane's.
    const SPREAD: [[u8; 32]; 4] = {
        let mut t = [[0u8; 32]; 4];
        let mut j = 0;
        while j < 4 {
            let mut i = 0;
            while i < 16 {
                t[j][i] = (4 * j + i % 2) as u8;
                t[j][16 + i] = (4 * j + 2 + i % 2) as u8;
                i += 1;
            }
            j += 1;
        }
        t
    };

    /// [`super::dot_reference`] in AVX2: a half's 64 bytes of low bits and 32 of high bits
    /// loaded once for its four groups; a group's `maddubs` of `q` less that of 32s (the
    /// `− 32`), then `madd` with its two scales.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot(w: &[u8], x: XRow<'_>) -> f32 {
        let n = w.len() / Q6K::BYTES;
        assert!(x.q.len() >= n * SUPER && x.d.len() >= n * GROUPS);
        let mut sets = [_mm256_setzero_ps(); 4];
        let (m32, low, two) = (
            _mm256_set1_epi8(32),
            _mm256_set1_epi8(0x0F),
            _mm256_set1_epi8(3),
        );
        for (s, block) in w.chunks_exact(Q6K::BYTES).enumerate() {
            // SAFETY: the groups read are in bounds (asserted), the bytes in the super-block.
            unsafe {
                let xd = _mm256_loadu_ps(x.d.as_ptr().add(s * GROUPS));
                let mut each = [0f32; 8];
                _mm256_storeu_ps(
                    each.as_mut_ptr(),
                    _mm256_mul_ps(_mm256_set1_ps(half(block, D)), xd),
                );
                for h in 0..2 {
                    let at = |offset: usize| block.as_ptr().add(offset).cast::<__m256i>();
                    let (ql0, ql1) = (
                        _mm256_loadu_si256(at(QL + 64 * h)),
                        _mm256_loadu_si256(at(QL + 64 * h + 32)),
                    );
                    let qh = _mm256_loadu_si256(at(QH + 32 * h));
                    let scales8 = _mm_loadl_epi64(block.as_ptr().add(SCALES + 8 * h).cast());
                    let scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(scales8));
                    let lows = [
                        _mm256_and_si256(ql0, low),
                        _mm256_and_si256(ql1, low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), low),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), low),
                    ];
                    let highs = [
                        _mm256_and_si256(qh, two),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), two),
                        _mm256_and_si256(_mm256_srli_epi16::<4>(qh), two),
                        _mm256_and_si256(_mm256_srli_epi16::<6>(qh), two),
                    ];
                    for j in 0..4 {
                        let g = 4 * h + j;
                        let q = _mm256_or_si256(lows[j], _mm256_slli_epi16::<4>(highs[j]));
                        let x8 =
                            _mm256_loadu_si256(x.q.as_ptr().add((s * GROUPS + g) * BLOCK).cast());
                        let p = _mm256_sub_epi16(pairs(q, x8), pairs(m32, x8));
                        let spread = _mm256_loadu_si256(SPREAD[j].as_ptr().cast());
                        let sc = _mm256_shuffle_epi8(scales, spread);
                        let lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, sc));
                        sets[j] = _mm256_fmadd_ps(lanes, _mm256_set1_ps(each[g]), sets[j]);
                    }
                }
            }
        }
        total(sets, _mm256_setzero_ps())
    }

    /// [`super::super::row_range`], compiled with the kernel's features so that [`dot`] is inlined.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn row_range(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::super::KMatrix<Q6K>,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot(w, x) })
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::avx2::half;
    use super::super::avx512::{pair_scale, total};
    use super::{BLOCK, D, GROUPS, Q6K, QH, QL, SCALES, SUPER, XRow};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// [`super::dot_reference`] with AVX-512 VNNI: groups `2p` and `2p + 1` (the two halves of
    /// 64 bytes of low bits, one high-bit shift apart) in one register, `dpbusd` against the
    /// pair's 64 activation bytes less a `dpbusd` of 32s, times each lane's scale.
    ///
    /// # Safety
    /// The CPU has every feature named below (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot(w: &[u8], x: XRow<'_>) -> f32 {
        let n = w.len() / Q6K::BYTES;
        assert!(x.q.len() >= n * SUPER && x.d.len() >= n * GROUPS);
        let (mut low, mut high) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let (mask, three) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(3));
        let zero = _mm512_setzero_si512();
        // Lane `l` of a pair takes scale `l / 4` of the pair's four.
        let spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
        for (s, block) in w.chunks_exact(Q6K::BYTES).enumerate() {
            // SAFETY: the groups read are in bounds (asserted), the bytes in the super-block.
            unsafe {
                let xd = _mm256_loadu_ps(x.d.as_ptr().add(s * GROUPS));
                let scales = _mm256_mul_ps(_mm256_set1_ps(half(block, D)), xd);
                let xq = x.q.as_ptr().add(s * SUPER);
                for p in 0..GROUPS / 2 {
                    let (h, j) = (p / 2, 2 * (p % 2));
                    // Groups `2p`, `2p + 1`: the two halves of 64 bytes, low or high nibbles.
                    let raw = _mm512_loadu_si512(block.as_ptr().add(QL + 64 * h).cast());
                    let ql = match j {
                        0 => _mm512_and_si512(raw, mask),
                        _ => _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask),
                    };
                    let qh = _mm256_loadu_si256(block.as_ptr().add(QH + 32 * h).cast());
                    let qh = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
                    let shifts = _mm512_inserti64x4(
                        _mm512_set1_epi16(2 * j as i16),
                        _mm256_set1_epi16(2 * j as i16 + 2),
                        1,
                    );
                    let high_bits = _mm512_and_si512(_mm512_srlv_epi16(qh, shifts), three);
                    let q = _mm512_or_si512(ql, _mm512_slli_epi16(high_bits, 4));
                    let xs = _mm512_loadu_si512(xq.add(2 * p * BLOCK).cast());
                    let sums = _mm512_sub_epi32(
                        _mm512_dpbusd_epi32(zero, q, xs),
                        _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(32), xs),
                    );
                    let at = SCALES + 8 * h + 2 * j;
                    let four = i32::from_le_bytes(block[at..at + 4].try_into().unwrap());
                    let sc = _mm_shuffle_epi8(_mm_cvtsi32_si128(four), spread);
                    let lanes =
                        _mm512_cvtepi32_ps(_mm512_mullo_epi32(sums, _mm512_cvtepi8_epi32(sc)));
                    let scale = pair_scale(scales, 2 * p);
                    match p % 2 {
                        0 => low = _mm512_fmadd_ps(lanes, scale, low),
                        _ => high = _mm512_fmadd_ps(lanes, scale, high),
                    }
                }
            }
        }
        total(low, high, _mm256_setzero_ps())
    }

    /// [`super::super::row_range`], compiled with the kernel's features so that [`dot`] is inlined.
    ///
    /// # Safety
    /// The CPU has every feature named below.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn row_range(
        out: &mut [f32],
        x: &super::Q8Rows,
        w: &super::super::KMatrix<Q6K>,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot(w, x) })
    }
}
