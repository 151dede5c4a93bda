//! GELU's tanh approximation (GPT-2's original `gelu_new`, PyTorch's
//! `gelu(approximate="tanh")`): `½·x·(1 + tanh(u))` with `u = √(2/π)·(x + 0.044715·x³)`,
//! the formula Burn's `gelu_approximate` composes.

use crate::fast_math::{tanh, vectorized};

/// `√(2/π)`.
const K: f32 = 0.797_884_6;
const A: f32 = 0.044_715;

vectorized! {
    /// `out = ½·x·(1 + tanh(u))`.
    pub(crate) fn forward(out: &mut [f32], x: &[f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            let t = tanh(K * (v + A * v * v * v));
            *o = 0.5 * v * (1.0 + t);
        }
    }
}

vectorized! {
    /// `dx = dout · (½·(1 + t) + ½·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²))`, `t = tanh(u)`,
    /// overwriting `dout` with `dx`.
    pub(crate) fn backward_in_place(dout: &mut [f32], x: &[f32]) {
        for (d, &v) in dout.iter_mut().zip(x) {
            let t = tanh(K * (v + A * v * v * v));
            let du = K * (1.0 + 3.0 * A * v * v);
            *d *= 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The forward against the formula in f64, the backward against its central difference.
    #[test]
    fn gelu_tanh_and_its_derivative() {
        let f = |x: f64| 0.5 * x * (1.0 + (0.797_884_560_8 * (x + 0.044_715 * x.powi(3))).tanh());
        let x: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.01).collect();
        let mut out = vec![0.0; x.len()];
        super::forward(&mut out, &x);
        let mut d = vec![1.0; x.len()];
        super::backward_in_place(&mut d, &x);
        for ((&x, &y), &dy) in x.iter().zip(&out).zip(&d) {
            let x64 = f64::from(x);
            assert!((f64::from(y) - f(x64)).abs() < 1e-6, "gelu_tanh({x}) = {y}");
            let h = 1e-4;
            let slope = (f(x64 + h) - f(x64 - h)) / (2.0 * h);
            assert!(
                (f64::from(dy) - slope).abs() < 1e-5,
                "gelu_tanh'({x}) = {dy}, want {slope}"
            );
        }
    }
}
