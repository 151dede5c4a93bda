//! Gradient clipping by the global norm, PyTorch's `clip_grad_norm_` (Burn's own clipping works
//! per tensor): every gradient is multiplied by `min(1, max_norm / (‖g‖ + 1e-6))`, ‖g‖ the norm
//! of all of them together. The one rule every engine applies; it is written twice only because
//! the fused CPU engine computes it on the host and the Burn engines on the device, and the test
//! below holds the two to each other.

use burn::tensor::Tensor;

/// Added to the norm before dividing, as PyTorch does.
pub const CLIP_EPSILON: f64 = 1e-6;

/// The factor that clips gradients of global norm `norm` to `max_norm`: at most 1. For a norm
/// that is not finite it means nothing (NaN gives 1, infinity 0): the engines skip such a step
/// rather than scale it.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    (max_norm / (norm + CLIP_EPSILON)).min(1.0)
}

/// [`clip_factor`] on the device: `norm` and the factor are `[1]`, nothing is read back.
pub fn clip_factor_on_device(norm: Tensor<1>, max_norm: f64) -> Tensor<1> {
    (norm + CLIP_EPSILON)
        .recip()
        .mul_scalar(max_norm)
        .clamp_max(1.0)
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;

    #[test]
    fn the_host_and_the_device_clip_alike() {
        let device = Device::flex();
        for (norm, max_norm) in [(0.5, 1.0), (1.0, 1.0), (3.0, 1.0), (1e6, 0.1), (2.0, 2.5)] {
            let host = clip_factor(norm, max_norm);
            let on_device = clip_factor_on_device(
                Tensor::from_data(TensorData::new(vec![norm as f32], [1]), &device),
                max_norm,
            );
            let on_device: Vec<f32> = on_device.into_data().try_to_vec::<f32>().unwrap();
            assert!(
                (f64::from(on_device[0]) - host).abs() < 1e-6 * host,
                "norm {norm}, max {max_norm}: {host} vs {}",
                on_device[0]
            );
            assert!(host <= 1.0);
            assert_eq!(
                host == 1.0,
                norm + CLIP_EPSILON <= max_norm,
                "{norm} {max_norm}"
            );
        }
        assert_eq!(clip_factor(f64::NAN, 1.0), 1.0);
        assert_eq!(clip_factor(3.0, f64::INFINITY), 1.0);
    }
}
