//! ReLU², `relu(x)²` (Primer; modded-nanogpt, nanochat), forward and backward.

use crate::fast_math::vectorized;

vectorized! {
    /// `out = max(x, 0)²`.
    pub(crate) fn forward(out: &mut [f32], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            let r = v.max(0.0);
            *o = r * r;
        }
    }
}

vectorized! {
    /// `dx = dout · 2·max(x, 0)`, overwriting `dout` with `dx`.
    pub(crate) fn backward_in_place(dout: &mut [f32], x: &[f32]) {
        for (d, &v) in dout.iter_mut().zip(x) {
            *d *= 2.0 * v.max(0.0);
        }
    }
}
