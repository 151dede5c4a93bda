//! Drawing one token from a row of logits (temperature and top-k, greedy at temperature 0),
//! and [`Sampled`]: the token as the model saw it. Shared by the host sampler and the rule a
//! decoder applies on its device.

/// One token as the model saw it: the token, its log-probability under the model (the
/// log-softmax of the raw logits, before any penalty, bias or temperature), and the `top` most
/// likely tokens with theirs, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl Sampled {
    /// `id` seen in `logits` (one per vocabulary entry), with the `top` most likely tokens.
    pub fn observe(logits: &[f32], id: u32, top: usize) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let log_z = max as f64 + sum.ln();
        let logprob = |i: usize| (logits[i] as f64 - log_z) as f32;
        let top = top.min(logits.len());
        let mut order: Vec<usize> = Vec::new();
        if top > 0 {
            // Most likely first; among equal logits, the lower id.
            let rank = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
            order = (0..logits.len()).collect();
            order.select_nth_unstable_by(top - 1, rank);
            order.truncate(top);
            order.sort_by(rank);
        }
        Self {
            id,
            logprob: logprob(id as usize),
            top: order.into_iter().map(|i| (i as u32, logprob(i))).collect(),
        }
    }
}

/// The sampler's pick without top-p or penalties, with the draw `uniform` given: the rule a
/// decoder applies on its device ([`crate::sample::Pick`]).
pub(crate) fn draw_from(
    logits: &[f32],
    temperature: f32,
    top_k: Option<usize>,
    uniform: f64,
) -> u32 {
    match temperature {
        0.0 => argmax(logits),
        _ => draw(&weights(logits, temperature, top_k), uniform),
    }
}

/// Each token's weight `exp((l - max) / temperature)`, 0 outside the `top_k` largest logits.
pub(crate) fn weights(logits: &[f32], temperature: f32, top_k: Option<usize>) -> Vec<f64> {
    let mut logits = logits.to_vec();
    if let Some(k) = top_k.filter(|&k| k < logits.len()) {
        let mut sorted = logits.clone();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        logits
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits
        .iter()
        .map(|&l| (((l - max) / temperature) as f64).exp())
        .collect()
}

/// The first token whose running sum of `weights` passes `uniform` (in `[0, 1)`) times their
/// total; the heaviest where rounding leaves the target past the end.
pub(crate) fn draw(weights: &[f64], uniform: f64) -> u32 {
    let total: f64 = weights.iter().sum();
    let mut r = uniform * total;
    for (i, w) in weights.iter().enumerate() {
        if r < *w {
            return i as u32;
        }
        r -= w;
    }
    argmax(weights)
}

pub(crate) fn argmax<T: PartialOrd>(values: &[T]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}
