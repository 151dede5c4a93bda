//! LayerNorm over the last axis, forward and backward, one loop per row (the forward reads each
//! row three times: its mean, its variance, the output; all from cache).

use crate::fast_math::vectorized;

vectorized! {
    /// `out = (x - mean) / √(var + ε) · gamma + beta` per row of `x [rows, width]`, ε the
    /// model's `layer_norm_eps`; keeps each row's mean and `1/√(var + ε)` for the backward pass.
    /// `beta` `None`: no shift.
    pub(crate) fn forward(
        out: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
        x: &[f32],
        gamma: &[f32],
        beta: Option<&[f32]>,
        epsilon: f32,
    ) {
        let width = gamma.len();
        for (r, (row, out)) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)).enumerate() {
            let m = row.iter().sum::<f32>() / width as f32;
            // The biased variance, as PyTorch's and Burn's LayerNorm.
            let var = row.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / width as f32;
            let s = 1.0 / (var + epsilon).sqrt();
            match beta {
                None => {
                    for ((o, v), g) in out.iter_mut().zip(row).zip(gamma) {
                        *o = (v - m) * s * g;
                    }
                }
                Some(beta) => {
                    for (((o, v), g), b) in out.iter_mut().zip(row).zip(gamma).zip(beta) {
                        *o = (v - m) * s * g + b;
                    }
                }
            }
            mean[r] = m;
            rstd[r] = s;
        }
    }
}

vectorized! {
    /// Adds the gradient of the loss with respect to `x` to `dx`, and to `gamma`/`beta` into
    /// `dgamma`/`dbeta` (`None`: no shift, or a frozen one; a frozen gain), given `dout`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        dx: &mut [f32],
        dgamma: Option<&mut [f32]>,
        dbeta: Option<&mut [f32]>,
        dout: &[f32],
        x: &[f32],
        mean: &[f32],
        rstd: &[f32],
        gamma: &[f32],
    ) {
        let mut dgamma = dgamma;
        let mut dbeta = dbeta;
        let width = gamma.len();
        let rows = dout.chunks_exact(width).zip(x.chunks_exact(width));
        for (r, ((dout, x), dx)) in rows.zip(dx.chunks_exact_mut(width)).enumerate() {
            let (m, s) = (mean[r], rstd[r]);
            // With n = (x - mean)·rstd and dn = dout·gamma:
            // dx = rstd · (dn - mean(dn) - n · mean(dn · n)).
            let mut dn_mean = 0.0;
            let mut dn_n_mean = 0.0;
            for ((d, v), g) in dout.iter().zip(x).zip(gamma) {
                let dn = d * g;
                dn_mean += dn;
                dn_n_mean += dn * (v - m) * s;
            }
            dn_mean /= width as f32;
            dn_n_mean /= width as f32;
            for (i, ((d, v), g)) in dout.iter().zip(x).zip(gamma).enumerate() {
                let n = (v - m) * s;
                if let Some(dgamma) = dgamma.as_deref_mut() {
                    dgamma[i] += n * d;
                }
                dx[i] += s * (d * g - dn_mean - n * dn_n_mean);
            }
            if let Some(dbeta) = dbeta.as_deref_mut() {
                for (db, d) in dbeta.iter_mut().zip(dout) {
                    *db += d;
                }
            }
        }
    }
}
