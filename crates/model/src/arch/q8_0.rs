//! GGUF's `Q8_0` rounding, as ggml's reference quantiser (`quantize_row_q8_0_ref`) does it: a
//! block of 32 weights becomes 32 signed bytes `q` and one f16 scale `d`, each weight `q · d`.
//! The number format a quantised matrix holds, defined once: the CPU's int8 kernels store it,
//! `export --dtype q8_0` writes it, and a LoRA run on a `q8_0` base
//! ([`BaseWeights::Q8_0`](super::BaseWeights::Q8_0)) computes with its values.

use half::f16;

/// Values per block.
pub const BLOCK: usize = 32;

/// One block of 32 values as GGUF's `Q8_0` stores it: its f16 scale and 32 bytes.
pub fn q8_0_block(x: &[f32; BLOCK]) -> (f16, [i8; BLOCK]) {
    let mut q = [0; BLOCK];
    let d = quantize_block(x, &mut q);
    (f16::from_f32(d), q)
}

/// `x`'s 32 values as bytes in `q`, returning the scale `d = max|x| / 127` (0 for a zero
/// block) before its rounding to f16: `q = round(x / d)` with `1 / d` taken from the f32 `d`
/// (ties away from zero).
#[inline(always)]
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> f32 {
    // Eight running maxima, then theirs: the same largest value as one running maximum (a
    // maximum rounds nothing), in vector code (one chain of 32 dependent maxima is not).
    let mut lanes = [0.0f32; 8];
    for chunk in x.chunks_exact(8) {
        lanes
            .iter_mut()
            .zip(chunk)
            .for_each(|(m, v)| *m = m.max(v.abs()));
    }
    let tail = x.chunks_exact(8).remainder();
    let amax = lanes.iter().chain(tail).fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        // |v · id| <= 127 up to `id`'s rounding, which `as` saturates.
        *q = (v * id).round() as i8;
    }
    d
}

/// A linear layer's weight `w [n_in, n_out]` (Burn's layout) rounded to `Q8_0` in blocks of
/// 32 along each output's inputs, in place: each value becomes `q · d` with `d` the block's
/// f16 scale, what a `Q8_0` copy of the matrix computes with. `n_in` must be whole blocks.
/// Rounding the result again changes nothing (a block's largest value is then exactly
/// `127 · d`), so a quantised copy can be made again from these values, bit for bit.
pub(crate) fn round_columns(w: &mut [f32], n_in: usize) {
    assert!(n_in.is_multiple_of(BLOCK), "a Q8_0 row is whole blocks");
    let n_out = w.len() / n_in;
    let (mut x, mut q) = ([0.0; BLOCK], [0i8; BLOCK]);
    for j in 0..n_out {
        for i0 in (0..n_in).step_by(BLOCK) {
            let at = |k: usize| (i0 + k) * n_out + j;
            x.iter_mut().enumerate().for_each(|(k, v)| *v = w[at(k)]);
            let d = f16::from_f32(quantize_block(&x, &mut q)).to_f32();
            q.iter()
                .enumerate()
                .for_each(|(k, &q)| w[at(k)] = f32::from(q) * d);
        }
    }
}
