//! The tile kernel on AVX-512 VNNI: [`super::reference`]'s numbers, sixteen lanes (weight
//! rows) at once, `R` activation rows sharing each weight vector loaded.

use super::{LANES, Panel, ROWS, Tile, TileFn, Unpack};
use std::arch::x86_64::*;

/// The kernels for `M` with [`ROWS`] rows and with one.
pub(super) fn tiles<M: Unpack>() -> (TileFn<ROWS>, TileFn<1>) {
    match (M::GROUP, M::MINIMUMS) {
        (32, false) => (tile::<32, false, ROWS>, tile::<32, false, 1>),
        (32, true) => (tile::<32, true, ROWS>, tile::<32, true, 1>),
        (16, false) => (tile::<16, false, ROWS>, tile::<16, false, 1>),
        (16, true) => (tile::<16, true, ROWS>, tile::<16, true, 1>),
        (group, _) => unreachable!("no type has groups of {group}"),
    }
}

/// Checks every bound [`tile_unchecked`] reads within, then runs it.
fn tile<const G: usize, const MIN: bool, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    out: &mut [[f32; LANES]; R],
) {
    super::check_tile::<G, MIN, R>(p, x, r0, 4);
    assert!(super::vector_sets().0, "the CPU has AVX-512 VNNI");
    // SAFETY: the CPU has the features (asserted), and every index the kernel reads is below
    // a length asserted above.
    unsafe { tile_unchecked::<G, MIN, R>(p, x, r0, out) }
}

/// # Safety
/// The CPU has AVX-512 F and VNNI; the panel holds `LANES · cols` bytes and `LANES` scales
/// (and minimums, with `MIN`) for each group; the tile's rows `r0..r0 + R` and their groups
/// are in bounds.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
unsafe fn tile_unchecked<const G: usize, const MIN: bool, const R: usize>(
    p: &Panel,
    x: Tile<'_>,
    r0: usize,
    out: &mut [[f32; LANES]; R],
) {
    let k = x.cols;
    let groups = k / G;
    let (wq, xq) = (p.q.as_ptr(), x.q.as_ptr());
    let (start, d, d_sum) = (
        x.groups.start.as_ptr(),
        x.groups.d.as_ptr(),
        x.groups.d_sum.as_ptr(),
    );
    let mut acc = [_mm512_setzero_ps(); R];
    for g in 0..groups {
        // SAFETY (this block): the caller's bounds.
        unsafe {
            let mut sums = [_mm512_setzero_si512(); R];
            for (r, sum) in sums.iter_mut().enumerate() {
                *sum = _mm512_set1_epi32(*start.add((r0 + r) * groups + g));
            }
            for t in 0..G / 4 {
                let w = _mm512_loadu_si512(wq.add((g * G / 4 + t) * 4 * LANES).cast());
                for (r, sum) in sums.iter_mut().enumerate() {
                    let four = xq.add((r0 + r) * k + g * G + 4 * t).cast::<i32>();
                    let x4 = _mm512_set1_epi32(four.read_unaligned());
                    *sum = _mm512_dpbusd_epi32(*sum, w, x4);
                }
            }
            let s = _mm512_loadu_ps(p.scales.as_ptr().add(g * LANES));
            for (r, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let at = (r0 + r) * groups + g;
                let scale = _mm512_mul_ps(s, _mm512_set1_ps(*d.add(at)));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, *acc);
                if MIN {
                    let m = _mm512_loadu_ps(p.minimums.as_ptr().add(g * LANES));
                    *acc = _mm512_fmadd_ps(m, _mm512_set1_ps(*d_sum.add(at)), *acc);
                }
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `out` is sixteen floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}

/// Words `16c..16c + 16` (four bytes each) of sixteen rows `k` bytes long into `q` in the
/// kernel's order (word `t` of row `l` at `(t · LANES + l) · 4`) for every whole `c`: a 16 × 16
/// transpose of 32-bit words in registers. Returns the words done (the rest are the caller's).
pub(super) fn interleave(rows: &[u8], k: usize, q: &mut [u8]) -> usize {
    assert!(rows.len() >= LANES * k && q.len() >= LANES * k && k.is_multiple_of(4));
    assert!(super::vector_sets().0, "the CPU has AVX-512");
    let columns = k / 64;
    for c in 0..columns {
        // SAFETY: the CPU has AVX-512 F (asserted); row `l`'s bytes `64c..64c + 64` are in
        // `rows` and the sixteen stores of 64 bytes from `64 · LANES · c` in `q` (asserted).
        unsafe {
            transpose(
                rows.as_ptr().add(64 * c),
                k,
                q.as_mut_ptr().add(64 * LANES * c),
            )
        };
    }
    columns * 16
}

/// The 16 × 16 transpose of 32-bit words behind [`interleave`]: rows at `from + l · k`, out
/// as sixteen vectors of sixteen words from `to`.
///
/// # Safety
/// The CPU has AVX-512 F; 64 bytes are readable at each `from + l · k` and 1024 writable at
/// `to`.
#[target_feature(enable = "avx512f")]
unsafe fn transpose(from: *const u8, k: usize, to: *mut u8) {
    // SAFETY: the caller's bounds.
    let r: [__m512i; 16] =
        std::array::from_fn(|l| unsafe { _mm512_loadu_si512(from.add(l * k).cast()) });
    let lo32 = |a, b| _mm512_unpacklo_epi32(a, b);
    let hi32 = |a, b| _mm512_unpackhi_epi32(a, b);
    let lo64 = |a, b| _mm512_unpacklo_epi64(a, b);
    let hi64 = |a, b| _mm512_unpackhi_epi64(a, b);
    let t: [__m512i; 16] = std::array::from_fn(|i| {
        let (a, b) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
        if i % 2 == 0 { lo32(a, b) } else { hi32(a, b) }
    });
    // Within each four: (t0, t2) low and high, (t1, t3) low and high.
    let u: [__m512i; 16] = std::array::from_fn(|i| {
        let base = i / 4 * 4;
        let (a, b) = (t[base + (i % 4) / 2], t[base + (i % 4) / 2 + 2]);
        if i % 2 == 0 { lo64(a, b) } else { hi64(a, b) }
    });
    let v: [__m512i; 16] = std::array::from_fn(|i| {
        let base = i / 8 * 8;
        let (a, b) = (u[base + i % 4], u[base + i % 4 + 4]);
        if (i % 8) < 4 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        }
    });
    for i in 0..16 {
        let (a, b) = (v[i % 8], v[i % 8 + 8]);
        let out = if i < 8 {
            _mm512_shuffle_i32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_i32x4::<0xdd>(a, b)
        };
        // SAFETY: the caller's bounds.
        unsafe { _mm512_storeu_si512(to.add(64 * i).cast(), out) };
    }
}
