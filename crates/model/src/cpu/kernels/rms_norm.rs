//! RMSNorm over the last axis, forward and backward: `x / √(mean(x²) + ε) · γ`, no mean
//! subtracted and no shift; `γ` absent (`None`) for nanochat's parameter-free form.

use crate::fast_math::vectorized;

vectorized! {
    /// `out = x · rstd · gamma` per row of `x [rows, width]` (`gamma` `None` = 1), with
    /// `rstd = 1/√(mean(x²) + ε)` kept per row for the backward pass.
    pub(crate) fn forward(
        out: &mut [f32],
        rstd: &mut [f32],
        x: &[f32],
        gamma: Option<&[f32]>,
        epsilon: f32,
    ) {
        let width = x.len() / rstd.len();
        for (r, (row, out)) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)).enumerate() {
            let ms = row.iter().map(|v| v * v).sum::<f32>() / width as f32;
            let s = 1.0 / (ms + epsilon).sqrt();
            match gamma {
                None => out.iter_mut().zip(row).for_each(|(o, v)| *o = v * s),
                Some(gamma) => {
                    for ((o, v), g) in out.iter_mut().zip(row).zip(gamma) {
                        *o = v * s * g;
                    }
                }
            }
            rstd[r] = s;
        }
    }
}

vectorized! {
    /// Adds the gradient with respect to `x` to `dx` and to `gamma` into `dgamma` (both
    /// gain-less when `gamma` is `None`; `dgamma` `None` too when the gain is frozen), given
    /// `dout`. With `n = x·rstd` and `dn = dout·γ`:
    /// `dx = rstd · (dn − n · mean(dn · n))`, `dγ = Σ_rows n · dout`.
    pub(crate) fn backward(
        dx: &mut [f32],
        dgamma: Option<&mut [f32]>,
        dout: &[f32],
        x: &[f32],
        rstd: &[f32],
        gamma: Option<&[f32]>,
    ) {
        let mut dgamma = dgamma;
        let width = x.len() / rstd.len();
        let gain = |i: usize| gamma.map_or(1.0, |gamma| gamma[i]);
        let rows = dout.chunks_exact(width).zip(x.chunks_exact(width));
        for (r, ((dout, x), dx)) in rows.zip(dx.chunks_exact_mut(width)).enumerate() {
            let s = rstd[r];
            let mut dn_n_mean = 0.0;
            for (i, (d, v)) in dout.iter().zip(x).enumerate() {
                dn_n_mean += d * gain(i) * v * s;
            }
            dn_n_mean /= width as f32;
            for (i, (d, v)) in dout.iter().zip(x).enumerate() {
                let n = v * s;
                if let Some(dgamma) = dgamma.as_deref_mut() {
                    dgamma[i] += n * d;
                }
                dx[i] += s * (d * gain(i) - n * dn_n_mean);
            }
        }
    }
}
