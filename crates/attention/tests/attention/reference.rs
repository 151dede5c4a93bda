//! The layer written plainly in f64, loop by loop, from its weights: what every backend's
//! outputs are checked against.

use super::{CausalSelfAttention, values};

/// The whole layer written plainly in f64 from its weights: the independent reference.
/// `x`: `[batch][seq][d]`; `pad`: per batch row, `true` = padding key.
pub(super) fn reference(
    layer: &CausalSelfAttention,
    x: &[f32],
    dims: [usize; 3],
    pad: Option<&[bool]>,
) -> Vec<f32> {
    let [batch, seq, d] = dims;
    let heads = layer.n_heads;
    let dh = d / heads;
    let f64s = |t: Vec<f32>| t.into_iter().map(f64::from).collect::<Vec<f64>>();
    let w_attn = f64s(values(layer.c_attn.weight.val())); // [d, 3d]
    let b_attn = layer.c_attn.bias.as_ref().map(|b| f64s(values(b.val())));
    let w_proj = f64s(values(layer.c_proj.weight.val())); // [d, d]
    let b_proj = layer.c_proj.bias.as_ref().map(|b| f64s(values(b.val())));
    let mut out = vec![0f32; batch * seq * d];
    for b in 0..batch {
        // qkv[t][c] for c in 0..3d
        let qkv: Vec<Vec<f64>> = (0..seq)
            .map(|t| {
                (0..3 * d)
                    .map(|c| {
                        let dot: f64 = (0..d)
                            .map(|i| x[(b * seq + t) * d + i] as f64 * w_attn[i * 3 * d + c])
                            .sum();
                        dot + b_attn.as_ref().map_or(0.0, |bias| bias[c])
                    })
                    .collect()
            })
            .collect();
        for t in 0..seq {
            let mut y = vec![0f64; d];
            for h in 0..heads {
                let q = |c: usize| qkv[t][h * dh + c];
                let k = |s: usize, c: usize| qkv[s][d + h * dh + c];
                let v = |s: usize, c: usize| qkv[s][2 * d + h * dh + c];
                let visible: Vec<usize> = (0..=t)
                    .filter(|&s| !pad.is_some_and(|p| p[b * seq + s]))
                    .collect();
                let scores: Vec<f64> = visible
                    .iter()
                    .map(|&s| (0..dh).map(|c| q(c) * k(s, c)).sum::<f64>() / (dh as f64).sqrt())
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = exps.iter().sum();
                for (&s, e) in visible.iter().zip(&exps) {
                    for c in 0..dh {
                        y[h * dh + c] += e / sum * v(s, c);
                    }
                }
            }
            for o in 0..d {
                let dot: f64 = (0..d).map(|i| y[i] * w_proj[i * d + o]).sum();
                out[(b * seq + t) * d + o] =
                    (dot + b_proj.as_ref().map_or(0.0, |bias| bias[o])) as f32;
            }
        }
    }
    out
}
