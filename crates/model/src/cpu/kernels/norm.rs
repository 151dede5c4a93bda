//! The normalisation the model's config names ([`Norm`]), forward and backward: each kind's
//! kernels live in their own file (`layer_norm.rs`, `rms_norm.rs`); this is the one `match`
//! that picks them, so a new kind is a new file and an arm here.

use super::{layer_norm, rms_norm};
use crate::arch::Norm;

/// A norm's output and the per-row statistics its backward reads (`mean` is LayerNorm's
/// alone), `[rows, width]` and `[rows]`.
pub(crate) struct Normed<'a> {
    pub out: &'a mut [f32],
    pub mean: &'a mut [f32],
    pub rstd: &'a mut [f32],
}

/// `out = norm(x)` per row of `x [rows, width]`, with the gain and shift the model has
/// (LayerNorm always has a gain).
pub(crate) fn forward(
    kind: Norm,
    n: Normed<'_>,
    x: &[f32],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    epsilon: f32,
) {
    match kind {
        Norm::Layer => {
            let gamma = gamma.expect("LayerNorm has a gain");
            layer_norm::forward(n.out, n.mean, n.rstd, x, gamma, beta, epsilon);
        }
        Norm::Rms | Norm::RmsUnit => rms_norm::forward(n.out, n.rstd, x, gamma, epsilon),
        Norm::None => n.out.copy_from_slice(x),
    }
}

/// The statistics [`forward`] kept, `(mean, rstd)`.
pub(crate) type Stats<'a> = (&'a [f32], &'a [f32]);

/// Adds the gradient with respect to `x` to `dx` and those of the gain and shift into
/// `dgamma`/`dbeta` (`None` where the model has no such parameter or it does not train), given
/// `dout`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    kind: Norm,
    dx: &mut [f32],
    dgamma: Option<&mut [f32]>,
    dbeta: Option<&mut [f32]>,
    dout: &[f32],
    x: &[f32],
    (mean, rstd): Stats<'_>,
    gamma: Option<&[f32]>,
) {
    match kind {
        Norm::Layer => {
            let gamma = gamma.expect("LayerNorm has a gain");
            layer_norm::backward(dx, dgamma, dbeta, dout, x, mean, rstd, gamma);
        }
        Norm::Rms | Norm::RmsUnit => rms_norm::backward(dx, dgamma, dout, x, rstd, gamma),
        Norm::None => dx.iter_mut().zip(dout).for_each(|(dx, d)| *dx += d),
    }
}
