//! [`Normalization`]: the norm before each sublayer and before the head, whichever [`Norm`] the
//! config names, as one Burn module.
//!
//! Its parameters keep Burn's `LayerNorm` names, `gamma` (the gain) and `beta` (the shift), so
//! the weights of LayerNorm models read and write under the same paths as before, and an RMSNorm
//! gain sits where a LayerNorm's would.

use burn::module::{Module, Param};
use burn::nn::Initializer;
use burn::tensor::module::layer_norm;
use burn::tensor::{DType, Device, FloatDType, Tensor};

use crate::arch::GptConfig;
use crate::arch::Norm;
use crate::gpu::{self, Kernels};

/// One normalisation over the channels of `[batch, seq, n_embd]`; see [`Norm`] for each kind's
/// formula.
#[derive(Module, Debug)]
pub struct Normalization {
    /// The learned gain `[n_embd]` (`layer`, `rms`); absent for `rms_unit`.
    pub gamma: Option<Param<Tensor<1>>>,
    /// The learned shift `[n_embd]` (`layer` with `bias`).
    pub beta: Option<Param<Tensor<1>>>,
    /// Which normalisation, and its ε: copied from the config at init (a module cannot see the
    /// model's config); private, so they cannot come to disagree with it.
    #[module(skip)]
    kind: Norm,
    #[module(skip)]
    epsilon: f64,
    /// The model's kernels ([`Kernels`]), handed down by [`Gpt`](crate::Gpt).
    #[module(skip)]
    kernels: Kernels,
}

impl Normalization {
    /// The norm `config` asks for on `device` (gain 1, shift 0), running `kernels`; `None` for
    /// [`Norm::None`].
    pub(crate) fn init(config: &GptConfig, device: &Device, kernels: Kernels) -> Option<Self> {
        let c = config.n_embd;
        let ones = || Some(Initializer::Ones.init([c], device));
        let (gamma, beta) = match config.norm {
            Norm::Layer => (
                ones(),
                config.bias.then(|| Initializer::Zeros.init([c], device)),
            ),
            Norm::Rms => (ones(), None),
            Norm::RmsUnit => (None, None),
            Norm::None => return None,
        };
        Some(Self {
            gamma,
            beta,
            kind: config.norm,
            epsilon: config.layer_norm_eps,
            kernels,
        })
    }

    /// This norm running `kernels`.
    pub(crate) fn set_kernels(&mut self, kernels: Kernels) {
        self.kernels = kernels;
    }

    /// `[batch, seq, n_embd] -> [batch, seq, n_embd]`, in the input's dtype. LayerNorm and
    /// RMSNorm run tinygpt's fused kernels with [`Kernels::Cube`] (f32) and Burn's ops elsewhere (LayerNorm
    /// exactly what Burn's `LayerNorm` module computes; RMSNorm [`rms_norm`]).
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [_, _, c] = x.dims();
        let device = x.device();
        let gamma = || match &self.gamma {
            Some(gamma) => gamma.val(),
            None => Tensor::ones([c], &device),
        };
        match self.kind {
            Norm::Layer => {
                let (gamma, beta) = (gamma(), self.beta.as_ref().map(Param::val));
                if self.kernels.fuse(x.dtype()) {
                    return gpu::layer_norm(x, gamma, beta, self.epsilon);
                }
                // Burn's LayerNorm widens f16 to f32 for its statistics, and so does this.
                match x.dtype() {
                    DType::F16 => {
                        let f32 = |t: Tensor<1>| t.cast(FloatDType::F32);
                        let y = layer_norm(
                            x.cast(FloatDType::F32),
                            f32(gamma),
                            beta.map(f32),
                            self.epsilon,
                        );
                        y.cast(FloatDType::F16)
                    }
                    _ => layer_norm(x, gamma, beta, self.epsilon),
                }
            }
            Norm::Rms | Norm::RmsUnit => {
                let gamma = self.gamma.as_ref().map(Param::val);
                match self.kernels.fuse(x.dtype()) {
                    true => gpu::rms_norm(x, gamma, self.epsilon),
                    false => rms_norm(x, gamma, self.epsilon),
                }
            }
            Norm::None => x,
        }
    }
}

/// `x / √(mean(x²) + ε) · γ` over the last axis (`γ` = 1 when absent), the statistics in f32.
/// Shapes: `x [batch, seq, c]`, `gamma [c]`.
pub fn rms_norm(x: Tensor<3>, gamma: Option<Tensor<1>>, epsilon: f64) -> Tensor<3> {
    let [_, _, c] = x.dims();
    let dtype = x.dtype();
    let x = x.cast(FloatDType::F32);
    let rms = x.clone().square().mean_dim(2).add_scalar(epsilon).sqrt();
    let y = x / rms;
    let y = match gamma {
        Some(gamma) => y * gamma.cast(FloatDType::F32).reshape([1, 1, c]),
        None => y,
    };
    y.cast(dtype)
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;

    /// RMSNorm against the formula in f64, with and without the gain; its output has RMS 1
    /// before the gain.
    #[test]
    fn rms_norm_is_the_formula() {
        let device = Device::flex();
        let x: Vec<f32> = (0..2 * 3 * 5)
            .map(|i| ((i * 7 % 11) as f32 - 4.0) * 0.7)
            .collect();
        let gamma = vec![0.5f32, 1.0, 2.0, -1.0, 3.0];
        let input = Tensor::<3>::from_data(TensorData::new(x.clone(), [2, 3, 5]), &device);
        let g = Tensor::<1>::from_data(TensorData::new(gamma.clone(), [5]), &device);
        for (with_gain, got) in [
            (true, rms_norm(input.clone(), Some(g), 1e-5)),
            (false, rms_norm(input, None, 1e-5)),
        ] {
            let got = got.into_data().try_to_vec::<f32>().unwrap();
            for (r, row) in x.chunks(5).enumerate() {
                let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 5.0;
                let rms = (ms + 1e-5).sqrt();
                for (c, &v) in row.iter().enumerate() {
                    let gain = if with_gain { f64::from(gamma[c]) } else { 1.0 };
                    let want = f64::from(v) / rms * gain;
                    let err = (f64::from(got[r * 5 + c]) - want).abs();
                    assert!(
                        err < 1e-5,
                        "row {r} channel {c}: {} vs {want}",
                        got[r * 5 + c]
                    );
                }
            }
        }
    }
}
