//! The tile kernel on AVX2: [`super::reference`]'s numbers, the panel's sixteen lanes as two
//! vectors of eight, two activation rows at a time. AVX2 has no `vpdpbusd`: `maddubs` multiplies
//! bytes into pairs summed in 16 bits, two steps' pairs are added in 16 bits (four products of
//! at most 63 · 127: 32,004, inside `i16`, which is why only types whose bytes stay at or under
//! 63 take this kernel), and `madd` by ones widens them into the 32-bit sums.

use super::{LANES, Panel, ROWS, Tile, TileFn, Unpack};
use std::arch::x86_64::*;

/// The kernels for `M` with [`ROWS`] rows and with one, where its bytes fit (see the module).
pub(super) fn tiles<M: Unpack>() -> Option<(TileFn<ROWS>, TileFn<1>)> {
    if M::LARGEST > 63 {
        return None;
    }
    Some(match (M::GROUP, M::MINIMUMS) {
        (32, false) => (tile::<32, false, ROWS>, tile::<32, false, 1>),
        (32, true) => (tile::<32, true, ROWS>, tile::<32, true, 1>),
        (16, false) => (tile::<16, false, ROWS>, tile::<16, false, 1>),
        (16, true) => (tile::<16, true, ROWS>, tile::<16, true, 1>),
        (group, _) => unreachable!("no type has groups of {group}"),
    })
}

/// Checks every bound [`rows_unchecked`] reads within, then runs it a pair of rows at a time
/// (and the last row alone).
fn tile<const G: usize, const MIN: bool, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    out: &mut [[f32; LANES]; R],
) {
    super::check_tile::<G, MIN, R>(p, x, r0, 8);
    assert!(super::vector_sets().1, "the CPU has AVX2 and FMA");
    let mut pairs = out.chunks_exact_mut(2);
    for (i, pair) in (&mut pairs).enumerate() {
        let pair: &mut [[f32; LANES]; 2] = pair.try_into().expect("two rows");
        // SAFETY: the CPU has the features (asserted), and every index read is below a
        // length asserted above.
        unsafe { rows_unchecked::<G, MIN, 2>(p, x, r0 + 2 * i, pair) };
    }
    if let [last] = pairs.into_remainder() {
        // SAFETY: as above.
        unsafe { rows_unchecked::<G, MIN, 1>(p, x, r0 + R - 1, std::array::from_mut(last)) };
    }
}

/// # Safety
/// The CPU has AVX2 and FMA; the panel holds `LANES · cols` bytes and `LANES` scales (and
/// minimums, with `MIN`) for each group; rows `r0..r0 + R` and their groups are in bounds.
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_unchecked<const G: usize, const MIN: bool, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    out: &mut [[f32; LANES]; R],
) {
    let k = x.cols;
    let groups = k / G;
    let (wq, xq) = (p.q.as_ptr(), x.q.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for g in 0..groups {
        // SAFETY (this block): the caller's bounds.
        unsafe {
            let mut sums = [[_mm256_setzero_si256(); 2]; R];
            for (r, sum) in sums.iter_mut().enumerate() {
                let start = _mm256_set1_epi32(*x.groups.start.as_ptr().add((r0 + r) * groups + g));
                *sum = [start, start];
            }
            for t in (0..G / 4).step_by(2) {
                let at = (g * G / 4 + t) * 4 * LANES;
                let w0 = [wq.add(at), wq.add(at + 32)].map(|p| _mm256_loadu_si256(p.cast()));
                let at = at + 4 * LANES;
                let w1 = [wq.add(at), wq.add(at + 32)].map(|p| _mm256_loadu_si256(p.cast()));
                for (r, sum) in sums.iter_mut().enumerate() {
                    let four = xq.add((r0 + r) * k + g * G + 4 * t).cast::<i32>();
                    let x0 = _mm256_set1_epi32(four.read_unaligned());
                    let x1 = _mm256_set1_epi32(four.add(1).read_unaligned());
                    for h in 0..2 {
                        let pairs = _mm256_add_epi16(
                            _mm256_maddubs_epi16(w0[h], x0),
                            _mm256_maddubs_epi16(w1[h], x1),
                        );
                        sum[h] = _mm256_add_epi32(sum[h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
            for (r, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let at = (r0 + r) * groups + g;
                let d = _mm256_set1_ps(*x.groups.d.as_ptr().add(at));
                for h in 0..2 {
                    let s = _mm256_loadu_ps(p.scales.as_ptr().add(g * LANES + 8 * h));
                    let scale = _mm256_mul_ps(s, d);
                    acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h]), scale, acc[h]);
                    if MIN {
                        let m = _mm256_loadu_ps(p.minimums.as_ptr().add(g * LANES + 8 * h));
                        let d_sum = _mm256_set1_ps(*x.groups.d_sum.as_ptr().add(at));
                        acc[h] = _mm256_fmadd_ps(m, d_sum, acc[h]);
                    }
                }
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        for (h, acc) in acc.into_iter().enumerate() {
            // SAFETY: `out` is sixteen floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), acc) };
        }
    }
}
