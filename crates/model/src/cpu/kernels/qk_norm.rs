//! QK-norm on the CPU, forward and backward: each head's query and key scaled to unit RMS, no
//! gain (`tinygpt_attention::qk_norm`). RMSNorm on `d_head`-wide pieces, so its backward is
//! RMSNorm's: `dx = rstd · (dn − n · mean(dn · n))`.

use crate::fast_math::vectorized;

vectorized! {
    /// Normalises every `d`-wide piece of `x` in place, writing the normalised values to `n`
    /// and each piece's `1/√(mean(x²) + ε)` to `rstd`.
    pub(crate) fn forward(x: &mut [f32], n: &mut [f32], rstd: &mut [f32], epsilon: f32) {
        let d = x.len() / rstd.len();
        for ((x, n), s) in x.chunks_exact_mut(d).zip(n.chunks_exact_mut(d)).zip(rstd) {
            let ms = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
            *s = 1.0 / (ms + epsilon).sqrt();
            for (x, n) in x.iter_mut().zip(n.iter_mut()) {
                *x *= *s;
                *n = *x;
            }
        }
    }
}

vectorized! {
    /// The gradient of the normalised pieces in `dx` becomes that of the raw ones, given the
    /// forward's `n` and `rstd`.
    pub(crate) fn backward_in_place(dx: &mut [f32], n: &[f32], rstd: &[f32]) {
        let d = dx.len() / rstd.len();
        for ((dx, n), &s) in dx.chunks_exact_mut(d).zip(n.chunks_exact(d)).zip(rstd) {
            let dot = dx.iter().zip(n).map(|(g, n)| g * n).sum::<f32>() / d as f32;
            dx.iter_mut().zip(n).for_each(|(g, n)| *g = s * (*g - n * dot));
        }
    }
}
