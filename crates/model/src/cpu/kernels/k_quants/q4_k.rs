//! `Q4_K`: 144 bytes for 256 values: `d` and `dmin` (f16), twelve bytes of eight 6-bit scales
//! and eight 6-bit minimums, and 128 bytes of nibbles (bytes `32p..32p + 32` hold group `2p` in
//! their low nibbles and group `2p + 1` in their high ones). Value `i` of group `g` is
//! `(d · sc_g) · q − dmin · m_g`. `Q5_K` (176 bytes) is the same with a fifth bit for each
//! value: bit `g` of byte `i` of 32 bytes between the scales and the nibbles (`q` up to 31).
//!
//! A group's product with an activation block `x = xd · xq` is
//! `xd · (d · sc_g) · Σ q · xq − xd · (dmin · m_g) · Σ xq`: the first sum in lanes as `Q8_0`'s,
//! the second the block's sum of bytes kept with the activations ([`super::super::q8::Q8Rows`]),
//! eight groups' minimums in one vector multiply-add.

use super::super::blocks::each_row;
use super::super::q8::{BLOCK, Q8Rows, XRow};
use super::{GROUPS, KMatrix, KType, SUPER, Sets, half, lanes};
use crate::arch::BlockType;

/// The k-quants with minimums: `Q4_K` (`FIVE` false) and `Q5_K`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Minimums<const FIVE: bool>;

/// `Q4_K`.
pub(crate) type Q4K = Minimums<false>;
/// `Q5_K`.
pub(crate) type Q5K = Minimums<true>;

/// A `Q4_K` matrix.
pub(crate) type Q4KMatrix = KMatrix<Q4K>;
/// A `Q5_K` matrix.
pub(crate) type Q5KMatrix = KMatrix<Q5K>;

/// Where a super-block's parts are: `d`, `dmin`, the scales, `Q5_K`'s fifth bits.
const D: usize = 0;
const DMIN: usize = 2;
const SCALES: usize = 4;
const QH: usize = 16;

impl<const FIVE: bool> Minimums<FIVE> {
    /// Where the nibbles start.
    const QS: usize = if FIVE { 48 } else { 16 };

    /// Group `g`'s value `i`, `q` (the nibble, and `Q5_K`'s fifth bit).
    #[inline]
    fn q(block: &[u8], g: usize, i: usize) -> u8 {
        let byte = block[Self::QS + (g / 2) * BLOCK + i];
        let nibble = if g.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        match FIVE {
            true => nibble | (((block[QH + i] >> g) & 1) << 4),
            false => nibble,
        }
    }
}

impl<const FIVE: bool> KType for Minimums<FIVE> {
    const BYTES: usize = if FIVE { 176 } else { 144 };
    const MINIMUMS: bool = true;
    const LARGEST: u8 = if FIVE { 31 } else { 15 };

    /// Group `g`: bytes `q`, scale `d · sc_g`, minimum `−(dmin · m_g)`.
    fn unpack(block: &[u8], u: &mut [u8], scales: &mut [f32], minimums: &mut [f32]) {
        let (d, dmin) = (half(block, D), half(block, DMIN));
        let (sc, m) = self::scales(&block[SCALES..QH]);
        // A pair of groups at a time from their 32 bytes (low nibbles, then high), the
        // fifth bits after: whole slices, so that the loops are vector code.
        let nibbles = &block[Self::QS..Self::QS + SUPER / 2];
        for (pair, bytes) in u
            .chunks_exact_mut(2 * BLOCK)
            .zip(nibbles.chunks_exact(BLOCK))
        {
            let (low, high) = pair.split_at_mut(BLOCK);
            for ((l, h), &b) in low.iter_mut().zip(high).zip(bytes) {
                (*l, *h) = (b & 0x0F, b >> 4);
            }
        }
        if FIVE {
            let fifth: &[u8; BLOCK] = block[QH..QH + BLOCK].try_into().expect("32 bytes");
            for (g, u) in u.chunks_exact_mut(BLOCK).enumerate() {
                u.iter_mut()
                    .zip(fifth)
                    .for_each(|(u, &h)| *u |= ((h >> g) & 1) << 4);
            }
        }
        for g in 0..GROUPS {
            scales[g] = d * f32::from(sc[g]);
            minimums[g] = -(dmin * f32::from(m[g]));
        }
    }

    fn dequantise(block: &[u8], out: &mut [f32]) {
        let kind = if FIVE {
            BlockType::Q5_K
        } else {
            BlockType::Q4_K
        };
        kind.decode(block, out);
    }
}

/// The eight groups' 6-bit scales and minimums (ggml's `get_scale_min_k4`): groups 0–3's in
/// the low six bits of bytes 0–3 and 4–7, groups 4–7's low four bits in bytes 8–11 and their
/// top two in the top bits of bytes 0–7. Shifts and masks on words, as ggml's vector code.
#[inline]
pub(crate) fn scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (six, four, two) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    let sc_high = (w2 & four) | (((w0 >> 6) & two) << 4);
    let m_high = ((w2 >> 4) & four) | (((w1 >> 6) & two) << 4);
    let join = |low: u32, high: u32| (u64::from(low) | (u64::from(high) << 32)).to_le_bytes();
    (join(w0 & six, sc_high), join(w1 & six, m_high))
}

/// The numbers every kernel computes for a row times an activation row ([`Sets`]): group `b`'s
/// lanes of `q · xq` times `(d · sc) · xd`, its activation sum times `(dmin · m) · xd`.
pub(crate) fn dot_reference<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
    let mut sets = Sets::new();
    for (s, block) in w.chunks_exact(Minimums::<FIVE>::BYTES).enumerate() {
        let (d, dmin) = (half(block, D), half(block, DMIN));
        let (sc, m) = scales(&block[SCALES..QH]);
        for g in 0..GROUPS {
            let b = s * GROUPS + g;
            let q = lanes(x, b, |i| i32::from(Minimums::<FIVE>::q(block, g, i)));
            sets.add(b, q, (d * f32::from(sc[g])) * x.d[b]);
            sets.add_min(b, x.sums[b], (dmin * f32::from(m[g])) * x.d[b]);
        }
    }
    sets.total()
}

kernels_of!(
    Q4K,
    dot_reference::<false>,
    avx2::dot::<false>,
    avx2::row_range::<false>,
    avx512::dot::<false>,
    avx512::row_range::<false>
);
kernels_of!(
    Q5K,
    dot_reference::<true>,
    avx2::dot::<true>,
    avx2::row_range::<true>,
    avx512::dot::<true>,
    avx512::row_range::<true>
);

/// A super-block's groups' scales `(d · sc) · xd` and minimums' `(dmin · m) · xd` as vectors
/// of eight (group order), for groups `8s..8s + 8` of the activations.
///
/// # Safety
/// The CPU has AVX2 and F16C; `block` is a super-block, `x` holds group `8s + 7`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn group_scales(
    block: &[u8],
    x: XRow<'_>,
    s: usize,
) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    let (sc, m) = scales(&block[SCALES..QH]);
    let widen = |v: [u8; 8]| {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(
            u64::from_le_bytes(v) as i64,
        )))
    };
    // SAFETY: the caller keeps groups `8s..8s + 8` of `x` in bounds.
    let xd = unsafe { _mm256_loadu_ps(x.d.as_ptr().add(s * GROUPS)) };
    // `d` and `dmin`, the block's first four bytes, by one F16C conversion.
    let pair = _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([
        block[D],
        block[D + 1],
        block[DMIN],
        block[DMIN + 1],
    ])));
    let d = _mm256_broadcastss_ps(pair);
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(pair));
    (
        _mm256_mul_ps(_mm256_mul_ps(d, widen(sc)), xd),
        _mm256_mul_ps(_mm256_mul_ps(dmin, widen(m)), xd),
    )
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::avx2::{pairs, total};
    use super::{BLOCK, GROUPS, Minimums, QH, SUPER, XRow, group_scales};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// [`super::dot_reference`] in AVX2: a pair of groups' nibbles from one load of 32 bytes,
    /// each group's lanes by `maddubs` and `madd`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
        let n = w.len() / Minimums::<FIVE>::BYTES;
        assert!(x.q.len() >= n * SUPER && x.d.len() >= n * GROUPS && x.sums.len() >= n * GROUPS);
        let mut sets = [_mm256_setzero_ps(); 4];
        let mut mins = _mm256_setzero_ps();
        let (low, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
        for (s, block) in w.chunks_exact(Minimums::<FIVE>::BYTES).enumerate() {
            // SAFETY: groups `8s..8s + 8` of `x` are in bounds (asserted); so are the
            // super-block's 128 bytes of nibbles.
            unsafe {
                let (scales, min_scales) = group_scales(block, x, s);
                let sums = _mm256_loadu_ps(x.sums.as_ptr().add(s * GROUPS));
                mins = _mm256_fmadd_ps(sums, min_scales, mins);
                let mut each = [0f32; 8];
                _mm256_storeu_ps(each.as_mut_ptr(), scales);
                let xq = x.q.as_ptr().add(s * SUPER);
                let qs = Minimums::<FIVE>::QS;
                let qh = match FIVE {
                    true => _mm256_loadu_si256(block.as_ptr().add(QH).cast()),
                    false => _mm256_setzero_si256(),
                };
                for p in 0..GROUPS / 2 {
                    let q = _mm256_loadu_si256(block.as_ptr().add(qs + p * BLOCK).cast());
                    let (mut lo, mut hi) = (
                        _mm256_and_si256(q, low),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), low),
                    );
                    if FIVE {
                        // Group `g`'s fifth bits are bit `g` of the 32 bytes: 16 where set.
                        let fifth = |g: usize| {
                            let bits = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(g as i32));
                            _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(1)), 4)
                        };
                        lo = _mm256_or_si256(lo, fifth(2 * p));
                        hi = _mm256_or_si256(hi, fifth(2 * p + 1));
                    }
                    let x0 = _mm256_loadu_si256(xq.add(2 * p * BLOCK).cast());
                    let x1 = _mm256_loadu_si256(xq.add((2 * p + 1) * BLOCK).cast());
                    let l0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs(lo, x0), ones));
                    let l1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs(hi, x1), ones));
                    // Groups `2p` and `2p + 1` go to sets `2p mod 4` and the next.
                    let (a, b) = ((2 * p) % 4, (2 * p + 1) % 4);
                    sets[a] = _mm256_fmadd_ps(l0, _mm256_set1_ps(each[2 * p]), sets[a]);
                    sets[b] = _mm256_fmadd_ps(l1, _mm256_set1_ps(each[2 * p + 1]), sets[b]);
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
        w: &super::super::KMatrix<Minimums<FIVE>>,
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
    use super::{BLOCK, GROUPS, Minimums, QH, SUPER, XRow, group_scales};
    use crate::cpu::kernels::k_quants::KType;
    use std::arch::x86_64::*;

    /// [`super::dot_reference`] with AVX-512 VNNI: a pair of groups' nibbles (low, high) in
    /// one register, unsigned into `dpbusd` against the pair's 64 activation bytes.
    ///
    /// # Safety
    /// The CPU has every feature named below (the lengths are asserted).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn dot<const FIVE: bool>(w: &[u8], x: XRow<'_>) -> f32 {
        let n = w.len() / Minimums::<FIVE>::BYTES;
        assert!(x.q.len() >= n * SUPER && x.d.len() >= n * GROUPS && x.sums.len() >= n * GROUPS);
        let (mut low, mut high) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut mins = _mm256_setzero_ps();
        let mask = _mm256_set1_epi8(0x0F);
        for (s, block) in w.chunks_exact(Minimums::<FIVE>::BYTES).enumerate() {
            // SAFETY: as in the AVX2 kernel.
            unsafe {
                let (scales, min_scales) = group_scales(block, x, s);
                let sums = _mm256_loadu_ps(x.sums.as_ptr().add(s * GROUPS));
                mins = _mm256_fmadd_ps(sums, min_scales, mins);
                let xq = x.q.as_ptr().add(s * SUPER);
                let qs = Minimums::<FIVE>::QS;
                let qh = match FIVE {
                    true => {
                        let qh = _mm256_loadu_si256(block.as_ptr().add(QH).cast());
                        _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1)
                    }
                    false => _mm512_setzero_si512(),
                };
                for p in 0..GROUPS / 2 {
                    let q = _mm256_loadu_si256(block.as_ptr().add(qs + p * BLOCK).cast());
                    let lo = _mm256_and_si256(q, mask);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                    let mut q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                    if FIVE {
                        // Bit `2p` of the fifth bits for the low half, `2p + 1` for the high.
                        let shifts = _mm512_inserti64x4(
                            _mm512_set1_epi16(2 * p as i16),
                            _mm256_set1_epi16(2 * p as i16 + 1),
                            1,
                        );
                        let bits =
                            _mm512_and_si512(_mm512_srlv_epi16(qh, shifts), _mm512_set1_epi8(1));
                        q = _mm512_or_si512(q, _mm512_slli_epi16(bits, 4));
                    }
                    let xs = _mm512_loadu_si512(xq.add(2 * p * BLOCK).cast());
                    let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xs);
                    let lanes = _mm512_cvtepi32_ps(sums);
                    // Pairs 0 and 2 are sets 0 and 1, pairs 1 and 3 sets 2 and 3.
                    let scale = pair_scale(scales, 2 * p);
                    match p % 2 {
                        0 => low = _mm512_fmadd_ps(lanes, scale, low),
                        _ => high = _mm512_fmadd_ps(lanes, scale, high),
                    }
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
        w: &super::super::KMatrix<Minimums<FIVE>>,
        b: &[f32],
        j0: usize,
    ) {
        // SAFETY: this function has the kernel's features.
        super::each_row(out, x, w, b, j0, |w, x| unsafe { dot::<FIVE>(w, x) })
    }
}
