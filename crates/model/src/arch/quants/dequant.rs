//! ggml's dequantisers (`dequantize_row_*`), one block at a time: each value computed by the
//! same f32 operations in the same order, so that a block gives the values llama.cpp reads
//! from it, bit for bit.

use half::f16;

use super::reference::scale_min;

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `Q8_0` (34 bytes): `q · d`.
pub(super) fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = f32::from(q as i8) * d;
    }
}

/// `Q5_0` (22 bytes): `(q − 16) · d`, `q`'s fifth bits in a word.
pub(super) fn q5_0(b: &[u8], out: &mut [f32]) {
    let (d, high) = (half(b, 0), u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
    let fifth = |bit: usize| (((high >> bit) & 1) << 4) as i32;
    for (j, &q) in b[6..22].iter().enumerate() {
        out[j] = ((i32::from(q & 0x0f) | fifth(j)) - 16) as f32 * d;
        out[j + 16] = ((i32::from(q >> 4) | fifth(j + 16)) - 16) as f32 * d;
    }
}

/// `Q4_0` (18 bytes): `(q − 8) · d`.
pub(super) fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        out[j] = (i32::from(q & 0x0f) - 8) as f32 * d;
        out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// `Q4_1` (20 bytes) or, with `FIVE`, `Q5_1` (24 bytes: a word of fifth bits after `d`, `m`):
/// `q · d + m`.
pub(super) fn minimums<const FIVE: bool>(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let (high, qs) = match FIVE {
        true => (u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24]),
        false => (0, &b[4..20]),
    };
    let fifth = |bit: usize| (((high >> bit) & 1) << 4) as u8;
    for (j, &q) in qs.iter().enumerate() {
        out[j] = f32::from((q & 0x0f) | fifth(j)) * d + m;
        out[j + 16] = f32::from((q >> 4) | fifth(j + 16)) * d + m;
    }
}

/// `Q4_K` (144 bytes) or, with `FIVE`, `Q5_K` (176 bytes: 32 bytes of fifth bits before the
/// nibbles): group `g`'s values `(d · sc) · q − dmin · m`.
pub(super) fn k_minimums<const FIVE: bool>(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let packed: &[u8; 12] = b[4..16].try_into().expect("12 bytes of scales");
    let (qh, qs) = match FIVE {
        true => (&b[16..48], &b[48..176]),
        false => (&b[..0], &b[16..144]),
    };
    for (pair, out) in out.chunks_exact_mut(64).enumerate() {
        let q = &qs[32 * pair..32 * pair + 32];
        for (half_, out) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = scale_min(2 * pair + half_, packed);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(m));
            let bit = 1u8 << (2 * pair + half_);
            for (l, o) in out.iter_mut().enumerate() {
                let low = if half_ == 0 { q[l] & 0x0f } else { q[l] >> 4 };
                let high = if FIVE && qh[l] & bit != 0 { 16 } else { 0 };
                *o = d1 * f32::from(low + high) - m1;
            }
        }
    }
}

/// `Q6_K` (210 bytes): value `d · sc · (q − 32)`, sixteen groups of 16 each a signed scale.
pub(super) fn q6_k(b: &[u8], out: &mut [f32]) {
    let d = half(b, 208);
    for (n, out) in out.chunks_exact_mut(128).enumerate() {
        let (ql, qh, sc) = (&b[64 * n..], &b[128 + 32 * n..], &b[192 + 8 * n..]);
        for l in 0..32 {
            let is = l / 16;
            let q = |low: u8, shift: u32| i32::from(low | (((qh[l] >> shift) & 3) << 4)) - 32;
            let q1 = q(ql[l] & 0x0f, 0);
            let q2 = q(ql[l + 32] & 0x0f, 2);
            let q3 = q(ql[l] >> 4, 4);
            let q4 = q(ql[l + 32] >> 4, 6);
            let scale = |k: usize| f32::from(sc[is + k] as i8);
            out[l] = d * scale(0) * q1 as f32;
            out[l + 32] = d * scale(2) * q2 as f32;
            out[l + 64] = d * scale(4) * q3 as f32;
            out[l + 96] = d * scale(6) * q4 as f32;
        }
    }
}
