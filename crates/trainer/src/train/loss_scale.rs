//! Dynamic loss scaling for f16 training (PyTorch's `GradScaler`), kept on the device.
//!
//! float16 has 5 exponent bits: gradients below ~6e-8 round to zero. Multiplying the loss by a
//! large scale lifts the gradients into f16's range during the backward pass; they are divided
//! by it again in f32 before clipping and AdamW. Too large a scale overflows to infinity: that
//! step is skipped (the non-finite guard does it) and the scale halves. After
//! [`GROWTH_INTERVAL`] finite steps in a row it doubles, to find the largest scale that fits.
//! bf16 has f32's exponent range and needs none of this.
//!
//! The scale and the count of finite steps are `[1]` tensors updated by the step's finiteness
//! flag on the device, so the GPU step still reads nothing back.

use burn::tensor::{Bool, Device, Tensor};

/// The first scale (PyTorch's default), 2^16.
pub(crate) const INITIAL_SCALE: f32 = 65536.0;
/// Finite steps in a row after which the scale doubles (PyTorch's default).
pub(crate) const GROWTH_INTERVAL: f32 = 2000.0;

/// The scale and its growth counter, on the device; see the module docs.
pub(crate) struct LossScale {
    /// `[1]`: what the loss is multiplied by before the backward pass.
    scale: Tensor<1>,
    /// `[1]`: finite steps since the scale last changed.
    finite_steps: Tensor<1>,
}

impl LossScale {
    /// The initial scale on `device` (not an autodiff device: the scale is a constant).
    pub fn new(device: &Device) -> Self {
        Self {
            scale: Tensor::full([1], INITIAL_SCALE, device),
            finite_steps: Tensor::zeros([1], device),
        }
    }

    /// The current scale, `[1]`.
    pub fn scale(&self) -> Tensor<1> {
        self.scale.clone()
    }

    /// After a step whose loss and gradient norm were `finite` (`[1]`): halve the scale if not,
    /// double it after [`GROWTH_INTERVAL`] finite steps in a row.
    pub fn update(&mut self, finite: Tensor<1, Bool>) {
        let overflow = finite.bool_not();
        let finite_steps = self
            .finite_steps
            .clone()
            .add_scalar(1.0)
            .mask_fill(overflow.clone(), 0.0);
        let grow = finite_steps.clone().greater_equal_elem(GROWTH_INTERVAL);
        let scale = self
            .scale
            .clone()
            .mask_where(overflow, self.scale.clone().mul_scalar(0.5));
        self.scale = scale
            .clone()
            .mask_where(grow.clone(), scale.mul_scalar(2.0));
        self.finite_steps = finite_steps.mask_fill(grow, 0.0);
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::TensorData;

    use super::*;

    fn read(t: &Tensor<1>) -> f32 {
        t.clone().into_data().try_to_vec::<f32>().unwrap()[0]
    }

    fn flag(finite: bool) -> Tensor<1, Bool> {
        Tensor::from_bool(TensorData::from([finite]), &Device::flex())
    }

    #[test]
    fn overflow_halves_and_a_long_finite_run_doubles() {
        let mut scale = LossScale::new(&Device::flex());
        assert_eq!(read(&scale.scale()), INITIAL_SCALE);
        scale.update(flag(false));
        scale.update(flag(false));
        assert_eq!(read(&scale.scale()), INITIAL_SCALE / 4.0);
        for _ in 0..GROWTH_INTERVAL as usize - 1 {
            scale.update(flag(true));
        }
        assert_eq!(read(&scale.scale()), INITIAL_SCALE / 4.0, "grew too soon");
        scale.update(flag(true));
        assert_eq!(read(&scale.scale()), INITIAL_SCALE / 2.0);
        // The count starts again after growing, and after an overflow.
        scale.update(flag(true));
        scale.update(flag(false));
        for _ in 0..GROWTH_INTERVAL as usize - 1 {
            scale.update(flag(true));
        }
        assert_eq!(read(&scale.scale()), INITIAL_SCALE / 4.0);
    }
}
