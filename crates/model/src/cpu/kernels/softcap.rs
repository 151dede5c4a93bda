//! The logits' soft-cap (Gemma 2, nanochat), forward and backward: `z ↦ cap · tanh(z / cap)`,
//! whose derivative is `1 − tanh²`.

use crate::fast_math::{tanh, vectorized};

vectorized! {
    /// `logits = cap · tanh(logits / cap)` in place, keeping `t = tanh(logits / cap)` for the
    /// backward pass.
    pub(crate) fn forward(logits: &mut [f32], t: &mut [f32], cap: f32) {
        for (z, t) in logits.iter_mut().zip(t.iter_mut()) {
            *t = tanh(*z / cap);
            *z = cap * *t;
        }
    }
}

vectorized! {
    /// The gradient of the capped logits in `d` becomes that of the raw ones: `d · (1 − t²)`.
    pub(crate) fn backward_in_place(d: &mut [f32], t: &[f32]) {
        for (d, t) in d.iter_mut().zip(t) {
            *d *= 1.0 - t * t;
        }
    }
}
