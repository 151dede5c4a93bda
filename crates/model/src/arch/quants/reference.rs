//! ggml's reference quantisers, one block at a time: what llama.cpp's `llama_model_quantize`
//! writes without an importance matrix (`quantize_row_q5_0_ref`, `_q4_0_ref`, `_q4_1_ref`,
//! `_q5_1_ref`, `_q4_K_ref`, `_q5_K_ref`, `_q6_K_ref`; `Q8_0`'s is `arch/q8_0.rs`), bit for bit:
//! the same f32 operations in the same order, each rounded on its own (ggml builds these in its
//! base library, without fused multiply-adds), and C's float-to-int conversions as C does them.
//! A file quantised here and one quantised by llama.cpp from the same values hold the same bytes
//! (the trainer's `tests/gguf_kquants.rs` and `tests/gguf_llamacpp.rs` compare them with
//! llama.cpp's own).
//!
//! Q4_K and Q5_K fit, for each group of 32, a scale and a minimum by weighted least squares
//! over a sweep of trial scales (`make_qkx2_quants`), then store both as 6-bit multiples of the
//! super-block's largest; Q6_K fits a signed scale per group of 16 (`make_qx_quants`), stored
//! as an 8-bit multiple of the super-block's.

use half::f16;

use crate::arch::q8_0::BLOCK;

/// Values in a k-quant's super-block.
pub const SUPER: usize = 256;

/// Values in each half of a block of 32 (a byte holds one of each half).
const HALF: usize = BLOCK / 2;

/// One block of 32 values as ggml's reference quantiser writes it (`quantize_row_q5_0_ref`):
/// `d = v / -16` for the value `v` of the largest magnitude (the first such), rounded to f16;
/// each value's `q = min(31, trunc(x · (1/d) + 16.5))`, `1/d` taken from the f32 `d`. Returns
/// the scale and the high bits.
pub(crate) fn quantize_q5_0(x: &[f32], nibbles: &mut [u8]) -> (f16, u32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            (amax, max) = (v.abs(), v);
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // C's `(int8_t)` truncates toward zero; `x · id + 16.5` is at least 0.5 here.
    let q = |v: f32| ((v * id + 16.5) as i8).min(31) as u8;
    let mut high = 0u32;
    for (j, b) in nibbles.iter_mut().enumerate() {
        let (low, up) = (q(x[j]), q(x[j + HALF]));
        *b = (low & 0x0F) | ((up & 0x0F) << 4);
        high |= (u32::from(low >> 4) << j) | (u32::from(up >> 4) << (j + HALF));
    }
    (f16::from_f32(d), high)
}

/// One block of 32 values as ggml's reference quantiser writes it (`quantize_row_q4_0_ref`):
/// `d = v / -8` for the value `v` of the largest magnitude (the first such), rounded to f16;
/// each value's nibble `min(15, trunc(x · (1/d) + 8.5))`, `1/d` taken from the f32 `d`.
pub(crate) fn quantize_q4_0(x: &[f32], nibbles: &mut [u8]) -> f16 {
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
        *b = nibble(x[j]) | (nibble(x[j + HALF]) << 4);
    }
    f16::from_f32(d)
}

/// C's `nearest_int`: round half to even through the float's mantissa (valid for |x| < 2²²,
/// as ggml asserts).
pub(super) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The f32 of an f16 that an f32 rounded to (ggml's `GGML_FP32_TO_FP16` then back).
fn f16_of(x: f32) -> (f16, f32) {
    let h = f16::from_f32(x);
    (h, h.to_f32())
}

/// `make_qkx2_quants`: levels `l[i]` in `0..=nmax` and `(scale, −min)` for `x ≈ scale·l + min`
/// (`min ≤ 0`), minimising the `weights`-weighted squared error over trial scales
/// `(rmin + rdelta·is + nmax) / (max − min)`, `is` in `0..=nstep`.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut aux = [0u8; BLOCK];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `make_qx_quants` with `rmse_type` 1 and no importance: signed levels `l[i] + nmax` in
/// `0..2·nmax` and the scale for `x ≈ scale·l`, weighted by `x²`, the best of 19 trial scales.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < 1e-15 {
        l.fill(0);
        return 0.0;
    }
    let level = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = level(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut iscale = -nmax as f32 / max;
    for (l, &v) in l.iter_mut().zip(x) {
        *l = (level(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l, &v) in l.iter_mut().zip(x) {
                *l = (level(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// `Q4_1` (`BITS` 4: 20 bytes) or `Q5_1` (`BITS` 5: 24 bytes) of 32 values: `d = (max − min) /
/// (2^BITS − 1)`, `m = min`, each `q = (x − min) · (1/d) + 0.5` truncated (Q4_1 capped at 15).
pub(super) fn minimum_block<const BITS: u32>(x: &[f32], out: &mut Vec<u8>) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / ((1 << BITS) - 1) as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
    out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
    // C's `(int8_t)` then `MIN(15, ·)` for Q4_1, `(uint8_t)` for Q5_1: both truncate toward zero
    // and the values here are never negative (`x ≥ min`), so `as u8` (saturating) agrees.
    let q = |v: f32| {
        let q = ((v - min) * id + 0.5) as u8;
        if BITS == 4 { q.min(15) } else { q }
    };
    let mut high = 0u32;
    let mut low = [0u8; BLOCK / 2];
    for j in 0..BLOCK / 2 {
        let (a, b) = (q(x[j]), q(x[j + BLOCK / 2]));
        low[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        high |= u32::from((a & 0x10) >> 4) << j;
        high |= u32::from((b & 0x10) >> 4) << (j + BLOCK / 2);
    }
    if BITS == 5 {
        out.extend_from_slice(&high.to_le_bytes());
    }
    out.extend_from_slice(&low);
}

/// The scales and minimums of a Q4_K or Q5_K super-block (`NMAX` 15 or 31): each group's fit,
/// then both as 6-bit multiples of the largest. Returns the levels `l` (before the final
/// requantisation), the 12 packed bytes and `d`, `dmin` as f16.
fn k_scales<const NMAX: i32>(x: &[f32], l: &mut [u8; SUPER]) -> ([u8; 12], f16, f16) {
    let (rmin, nstep) = if NMAX == 15 { (-1.0, 20) } else { (-0.5, 15) };
    let (mut scales, mut mins) = ([0.0f32; 8], [0.0f32; 8]);
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0.0f32; BLOCK];
    for j in 0..SUPER / BLOCK {
        let x = &x[BLOCK * j..BLOCK * (j + 1)];
        let mut sum_x2 = 0.0f32;
        for &v in x {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(x) {
            *w = av_x + v.abs();
        }
        let group = &mut l[BLOCK * j..BLOCK * (j + 1)];
        (scales[j], mins[j]) = make_qkx2_quants(NMAX, x, &weights, group, rmin, 0.1, nstep);
        // C's `if (v > max) max = v`: a minimum of −0.0 leaves the largest +0.0.
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..SUPER / BLOCK {
        // C stores `nearest_int` in a uint8_t (wrapping), then caps it at 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0f) | ((lm & 0x0f) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, _) = f16_of(max_scale / 63.0);
    let (dmin, _) = f16_of(max_min / 63.0);
    (packed, d, dmin)
}

/// ggml's `get_scale_min_k4`: group `j`'s 6-bit scale and minimum from the packed 12 bytes.
pub(super) fn scale_min(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// A Q4_K (`NMAX` 15: 144 bytes) or Q5_K (`NMAX` 31: 176 bytes) super-block of 256 values.
pub(super) fn k_block<const NMAX: i32>(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; SUPER];
    let (packed, d, dmin) = k_scales::<NMAX>(x, &mut l);
    for j in 0..SUPER / BLOCK {
        let (sc, m) = scale_min(j, &packed);
        let dj = d.to_f32() * f32::from(sc);
        if dj == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for i in 0..BLOCK {
            let v = x[BLOCK * j + i];
            l[BLOCK * j + i] = nearest_int((v + dm) / dj).clamp(0, NMAX) as u8;
        }
    }
    out.extend_from_slice(&d.to_le_bytes());
    out.extend_from_slice(&dmin.to_le_bytes());
    out.extend_from_slice(&packed);
    if NMAX == 31 {
        let mut qh = [0u8; 32];
        for (pair, n) in (0..SUPER).step_by(64).enumerate() {
            for (j, h) in qh.iter_mut().enumerate() {
                *h |= ((l[n + j] >> 4) & 1) << (2 * pair);
                *h |= ((l[n + j + 32] >> 4) & 1) << (2 * pair + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for n in (0..SUPER).step_by(64) {
        for j in 0..32 {
            out.push((l[n + j] & 0x0f) | ((l[n + j + 32] & 0x0f) << 4));
        }
    }
}

/// A Q6_K super-block of 256 values (210 bytes: low nibbles, high pairs, 16 scales, `d`).
pub(super) fn q6_k_block(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; SUPER];
    let mut scales = [0.0f32; SUPER / 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for (ib, scale) in scales.iter_mut().enumerate() {
        *scale = make_qx_quants(
            32,
            &x[16 * ib..16 * (ib + 1)],
            &mut l[16 * ib..16 * (ib + 1)],
        );
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = *scale;
        }
    }
    if max_abs_scale < 1e-15 {
        out.extend_from_slice(&[0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let (d, d32) = f16_of(1.0 / iscale);
    let mut sc = [0i8; SUPER / 16];
    for (s, &scale) in sc.iter_mut().zip(&scales) {
        // C's `MIN(127, nearest_int(·))` stored in an int8_t (never below −128 here).
        *s = nearest_int(iscale * scale).min(127) as i8;
    }
    for j in 0..SUPER / 16 {
        let dj = d32 * f32::from(sc[j]);
        if dj == 0.0 {
            continue;
        }
        for i in 0..16 {
            let q = nearest_int(x[16 * j + i] / dj).clamp(-32, 31);
            l[16 * j + i] = (q + 32) as u8;
        }
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for (half, j) in (0..SUPER).step_by(128).enumerate() {
        for i in 0..32 {
            let q = |k: usize| l[j + i + 32 * k];
            ql[64 * half + i] = (q(0) & 0x0f) | ((q(2) & 0x0f) << 4);
            ql[64 * half + i + 32] = (q(1) & 0x0f) | ((q(3) & 0x0f) << 4);
            qh[32 * half + i] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&s| s as u8));
    out.extend_from_slice(&d.to_le_bytes());
}
