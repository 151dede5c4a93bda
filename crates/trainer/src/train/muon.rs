//! Muon (Keller Jordan 2024; modded-nanogpt, nanochat) for the matrices inside the blocks:
//! SGD with Nesterov momentum whose update is replaced by the nearest semi-orthogonal matrix
//! (Newton–Schulz iteration), so every direction of a weight matrix moves by the same amount.
//!
//! The algorithm is Burn's `Muon` (`burn-optim`'s `optim/muon.rs`: Nesterov momentum without
//! dampening, Frobenius normalisation clamped at 1e-7, five quintic steps with (3.4445, −4.775,
//! 2.0315), the learning rate scaled by `√max(1, rows/cols)` of Burn's `[in, out]` weight), with
//! two things Burn's fixes and nanochat varies: the momentum warms up from `momentum_start` to
//! `momentum` over `warmup` steps, and the group has its own learning rate (`lr_ratio` times the
//! schedule's). The step count lives in each parameter's state, so a resumed run continues the
//! warm-up exactly. The fused CPU engine runs the same algorithm on its own buffers (the model
//! crate's `cpu/train/muon.rs`), and shares these settings and constants.

use burn::optim::{LearningRate, RecordState, StateSink, StateSource};
use burn::tensor::{Device, Tensor, TensorData};
use burn_pack::Scalar;

pub use tinygpt_model::MuonSettings;
use tinygpt_model::{
    gpu::sum_all, step::NEWTON_SCHULZ as NS, step::NEWTON_SCHULZ_EPSILON as NS_EPSILON,
    step::NEWTON_SCHULZ_STEPS as NS_STEPS,
};

/// Muon as one of Burn's per-parameter optimizers (a group of a `ModuleOptimizer`).
#[derive(Debug, Clone)]
pub struct Muon {
    pub settings: MuonSettings,
}

/// One matrix's state: the momentum buffer and the updates taken so far.
#[derive(Debug, Clone)]
pub struct MuonState<const D: usize> {
    pub velocity: Tensor<D>,
    pub step: u64,
}

/// Saved as `{id}.velocity` and the scalar `{id}.step` in the checkpoint's `optimizer.bpk`.
impl<const D: usize> RecordState for MuonState<D> {
    fn state_flatten(&self, prefix: &str, out: &mut StateSink) {
        out.push_tensor(prefix, "velocity", self.velocity.to_data());
        out.push_scalar(prefix, "step", Scalar::UInt(self.step));
    }

    fn state_unflatten(prefix: &str, src: &mut StateSource, device: &Device) -> Option<Self> {
        let velocity: TensorData = src.take_tensor(prefix, "velocity")?;
        let step = match src.take_scalar(prefix, "step")? {
            Scalar::UInt(step) => step,
            _ => return None,
        };
        Some(Self {
            velocity: Tensor::from_data(velocity, device),
            step,
        })
    }
}

impl burn::optim::Optimizer for Muon {
    type State<const D: usize> = MuonState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let s = &self.settings;
        let step = state.as_ref().map_or(0, |state| state.step);
        let momentum = s.momentum_at(step);
        // Burn's `Momentum` with dampening 0 and Nesterov: v ← g + μ·v, update g + μ·v.
        let velocity = match state {
            Some(state) => grad.clone() + state.velocity.mul_scalar(momentum),
            None => grad.clone(),
        };
        let nesterov = velocity.clone().mul_scalar(momentum) + grad;
        let update = zeropower(nesterov);
        let lr = lr * s.lr_ratio;
        let dims = tensor.dims();
        let ratio = match D {
            2 => (dims[0] as f64 / dims[1] as f64).max(1.0).sqrt(),
            _ => 1.0,
        };
        let tensor = match s.weight_decay {
            0.0 => tensor,
            decay => tensor.mul_scalar(1.0 - lr * decay),
        };
        let state = MuonState {
            velocity,
            step: step + 1,
        };
        (tensor - update.mul_scalar(lr * ratio), Some(state))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        MuonState {
            velocity: state.velocity.to_device(device),
            step: state.step,
        }
    }
}

/// The nearest semi-orthogonal matrix to `g` (`U·Vᵀ` of its SVD, approximately), by the
/// quintic Newton–Schulz iteration on `g / ‖g‖_F`, on the wide orientation. Burn's
/// `zeropower_via_newtonschulz`, which is private there. Tensors of another rank than 2 (which
/// the group never holds) come back as they are.
fn zeropower<const D: usize>(g: Tensor<D>) -> Tensor<D> {
    if D != 2 {
        return g;
    }
    let [rows, cols] = [g.dims()[0], g.dims()[1]];
    let tall = rows > cols;
    let mut x = if tall { g.swap_dims(0, 1) } else { g };
    let norm = sum_all(x.clone().powf_scalar(2.0).reshape([rows * cols]))
        .sqrt()
        .clamp_min(NS_EPSILON)
        .unsqueeze();
    x = x.div(norm);
    let (a, b, c) = NS;
    for _ in 0..NS_STEPS {
        let gram = x.clone().matmul(x.clone().swap_dims(0, 1));
        let poly = gram.clone().mul_scalar(b) + gram.clone().matmul(gram).mul_scalar(c);
        x = x.clone().mul_scalar(a) + poly.matmul(x);
    }
    if tall { x.swap_dims(0, 1) } else { x }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::optim::Optimizer as _;
    use burn::tensor::Distribution;

    fn settings() -> MuonSettings {
        MuonSettings {
            lr_ratio: 20.0,
            momentum: 0.95,
            momentum_start: 0.85,
            warmup: 300,
            weight_decay: 0.0,
        }
    }

    /// The orthogonalised update has every singular value near 1: `X Xᵀ ≈ I` on the short side,
    /// for a wide and a tall matrix alike (the quintic iteration lands in about [0.7, 1.2]).
    #[test]
    fn newton_schulz_orthogonalises() {
        let device = Device::flex();
        for shape in [[8, 24], [24, 8]] {
            let g = Tensor::<2>::random(shape, Distribution::Normal(0.0, 3.0), &device);
            let x = zeropower(g);
            let short = shape[0].min(shape[1]);
            let gram = match shape[0] <= shape[1] {
                true => x.clone().matmul(x.swap_dims(0, 1)),
                false => x.clone().swap_dims(0, 1).matmul(x),
            };
            let gram = gram.into_data().try_to_vec::<f32>().unwrap();
            for i in 0..short {
                let diagonal = gram[i * short + i];
                assert!(
                    (0.5..1.5).contains(&diagonal),
                    "{shape:?} [{i}] = {diagonal}"
                );
            }
            let off = (0..short * short)
                .filter(|k| k / short != k % short)
                .map(|k| gram[k].abs())
                .fold(0f32, f32::max);
            assert!(off < 0.3, "{shape:?}: off-diagonal {off}");
        }
    }

    /// The momentum warms up linearly and the state counts steps; a step equals the formula
    /// written out (Nesterov momentum, then Newton–Schulz, then the shape-scaled learning rate).
    #[test]
    fn one_step_is_the_formula_and_the_state_counts() {
        let s = settings();
        assert!((s.momentum_at(0) - 0.85).abs() < 1e-12);
        assert!((s.momentum_at(150) - 0.90).abs() < 1e-12);
        assert!((s.momentum_at(900) - 0.95).abs() < 1e-12);
        let device = Device::flex();
        let w = Tensor::<2>::random([6, 3], Distribution::Normal(0.0, 1.0), &device);
        let g = Tensor::<2>::random([6, 3], Distribution::Normal(0.0, 1.0), &device);
        let v = Tensor::<2>::random([6, 3], Distribution::Normal(0.0, 1.0), &device);
        let muon = Muon { settings: s };
        let state = MuonState {
            velocity: v.clone(),
            step: 150,
        };
        let (got, state) = muon.step(1e-3, w.clone(), g.clone(), Some(state));
        let state = state.unwrap();
        assert_eq!(state.step, 151);
        let velocity = g.clone() + v.mul_scalar(0.9);
        let want =
            w - zeropower(velocity.clone().mul_scalar(0.9) + g).mul_scalar(0.02 * 2f64.sqrt());
        let close = |a: Tensor<2>, b: Tensor<2>| {
            let (a, b) = (
                a.into_data().try_to_vec::<f32>().unwrap(),
                b.into_data().try_to_vec::<f32>().unwrap(),
            );
            a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-6)
        };
        assert!(close(got, want));
        assert!(close(state.velocity, velocity));
    }
}
