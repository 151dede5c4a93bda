//! Softmax cross-entropy over the vocabulary with `ignore_index`, loss and gradient in one pass.

use crate::fast_math::exp;
use crate::nn::IGNORE_INDEX;

/// Returns the summed negative log-likelihood of the kept `targets` under `logits [rows, vocab]`.
/// With `grad_scale`, overwrites `logits` with `d(loss)/d(logits) = (softmax - onehot) ·
/// grad_scale` on kept rows and zeros on ignored ones.
pub(crate) fn forward(logits: &mut [f32], targets: &[i64], grad_scale: Option<f32>) -> f64 {
    let vocab = logits.len() / targets.len();
    let mut total = 0.0f64;
    for (row, &target) in logits.chunks_exact_mut(vocab).zip(targets) {
        if target == IGNORE_INDEX {
            if grad_scale.is_some() {
                row.fill(0.0);
            }
            continue;
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = row.iter().map(|l| exp(l - max)).sum();
        let log_sum = max + sum.ln();
        total += f64::from(log_sum - row[target as usize]);
        if let Some(scale) = grad_scale {
            for l in row.iter_mut() {
                *l = exp(*l - log_sum) * scale;
            }
            row[target as usize] -= scale;
        }
    }
    total
}
