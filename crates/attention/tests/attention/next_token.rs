//! The seeds' next-token loss: `F.cross_entropy(logits, targets, ignore_index=-1)`, its
//! ignored positions counted nowhere.

use super::*;
use burn::tensor::Int;
use tinygpt_attention::next_token::{IGNORE_INDEX, log_likelihoods, next_token_loss};

fn targets(ids: &[i64], device: &Device) -> Tensor<1, Int> {
    Tensor::from_data(TensorData::new(ids.to_vec(), [ids.len()]), device)
}

/// The loss written out on the host: −mean over the kept rows of log_softmax(row)[target].
fn by_hand(logits: &[f32], vocab: usize, ids: &[i64]) -> f64 {
    let terms: Vec<f64> = logits
        .chunks(vocab)
        .zip(ids)
        .filter(|&(_, &t)| t != IGNORE_INDEX)
        .map(|(row, &t)| {
            let max = row.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            row[t as usize] as f64 - max - sum.ln()
        })
        .collect();
    -terms.iter().sum::<f64>() / terms.len() as f64
}

#[test]
fn the_loss_is_the_mean_over_the_kept_targets() {
    let device = Device::flex();
    let (n, vocab) = (6, 5);
    let logits = random([n, vocab], &device);
    let ids = [0, 3, IGNORE_INDEX, 4, IGNORE_INDEX, 2];
    let loss = values(next_token_loss(logits.clone(), targets(&ids, &device)))[0];
    let want = by_hand(&values(logits.clone()), vocab, &ids);
    assert!((loss as f64 - want).abs() < 1e-6, "{loss} vs {want}");
    // The ignored rows' terms are exactly 0, whatever their logits.
    let terms = values(log_likelihoods(logits, targets(&ids, &device)));
    assert_eq!((terms[2], terms[4]), (0.0, 0.0));
    assert!(
        terms
            .iter()
            .enumerate()
            .all(|(i, &t)| i == 2 || i == 4 || t < 0.0)
    );
    // Every target ignored: 0 / 0, as PyTorch.
    let none = next_token_loss(random([2, vocab], &device), targets(&[-1, -1], &device));
    assert!(values(none)[0].is_nan());
}

#[test]
fn padding_changes_neither_the_loss_nor_a_gradient() {
    let device = Device::flex().autodiff();
    let vocab = 7;
    let kept = random([3, vocab], &device).require_grad();
    let padding = random([2, vocab], &device).require_grad();
    let ids = [1, 6, 0];
    let alone = next_token_loss(kept.clone(), targets(&ids, &device));
    let padded_ids = [1, 6, 0, IGNORE_INDEX, IGNORE_INDEX];
    let both = Tensor::cat(vec![kept.clone(), padding.clone()], 0);
    let padded = next_token_loss(both, targets(&padded_ids, &device));
    assert_eq!(values(alone.clone()), values(padded.clone()));
    let (g_alone, g_padded) = (alone.backward(), padded.backward());
    let grad = |g| values(kept.grad(g).unwrap());
    assert_eq!(grad(&g_alone), grad(&g_padded));
    let pad_grad = values(padding.grad(&g_padded).unwrap());
    assert!(pad_grad.iter().all(|&g| g == 0.0), "{pad_grad:?}");
}
