//! GELU, the exact form `x · Φ(x)` that Burn's and PyTorch's default `gelu` compute (Φ the
//! standard normal CDF, computed to f32 precision by [`normal_cdf_pdf`]).

use crate::fast_math::{normal_cdf_pdf, vectorized};

vectorized! {
    /// `out = x · Φ(x)`.
    pub(crate) fn forward(out: &mut [f32], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v * normal_cdf_pdf(v).0;
        }
    }
}

vectorized! {
    /// `dx = dout · (Φ(x) + x·φ(x))`, overwriting `dout` with `dx` (the pre-activation
    /// gradient).
    pub(crate) fn backward_in_place(dout: &mut [f32], x: &[f32]) {
        for (d, &v) in dout.iter_mut().zip(x) {
            let (cdf, pdf) = normal_cdf_pdf(v);
            *d *= cdf + v * pdf;
        }
    }
}
