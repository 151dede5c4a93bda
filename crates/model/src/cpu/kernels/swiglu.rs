//! SwiGLU (Shazeer 2020; PaLM, Llama): `silu(gate) ⊙ up`, forward and backward, with the MLP's
//! first projection giving `[gate | up]` side by side in each row and `silu(x) = x·σ(x)`.

use crate::fast_math::{exp, vectorized};

vectorized! {
    /// `out [rows, hidden] = silu(gate) ⊙ up` from `fc [rows, 2·hidden]` (`[gate | up]`).
    pub(crate) fn forward(out: &mut [f32], fc: &[f32], hidden: usize) {
        let rows = out.len() / hidden;
        for r in 0..rows {
            let (gate, up) = fc[r * 2 * hidden..(r + 1) * 2 * hidden].split_at(hidden);
            let out = &mut out[r * hidden..(r + 1) * hidden];
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = g * sigmoid(g) * u;
            }
        }
    }
}

vectorized! {
    /// `d_fc [rows, 2·hidden]` (written) from the output's gradient `d_out [rows, hidden]`:
    /// `d_gate = d · up · σ(g)·(1 + g·(1 − σ(g)))`, `d_up = d · silu(g)`.
    pub(crate) fn backward(d_fc: &mut [f32], d_out: &[f32], fc: &[f32], hidden: usize) {
        let rows = d_out.len() / hidden;
        for r in 0..rows {
            let row = r * 2 * hidden..(r + 1) * 2 * hidden;
            let (gate, up) = fc[row.clone()].split_at(hidden);
            let (d_gate, d_up) = d_fc[row].split_at_mut(hidden);
            let d = &d_out[r * hidden..(r + 1) * hidden];
            for i in 0..hidden {
                let (g, u) = (gate[i], up[i]);
                let s = sigmoid(g);
                d_gate[i] = d[i] * u * s * (1.0 + g * (1.0 - s));
                d_up[i] = d[i] * g * s;
            }
        }
    }
}

/// `σ(x) = 1 / (1 + e^(−x))`, through the vectorisable [`exp`].
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}
