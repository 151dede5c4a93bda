//! Drawing one token from a row of logits (temperature and top-k, greedy at temperature 0),
//! and [`Sampled`]: the token as the model saw it. Shared by the host sampler and the rule a
//! decoder applies on its device.

use crate::fast_math::{exp, vectorized};

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
        let max = greatest(logits);
        let log_z = max as f64 + exp_total(logits, max).ln();
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
        0.0 => argmax_logits(logits),
        _ => draw(&weights(logits, temperature, top_k), uniform),
    }
}

/// Each token's weight `exp((l - max) / temperature)`, 0 outside the `top_k` largest logits.
pub(crate) fn weights(logits: &[f32], temperature: f32, top_k: Option<usize>) -> Vec<f64> {
    let mut logits = logits.to_vec();
    if let Some(k) = top_k.filter(|&k| k < logits.len()) {
        // The k-th largest, as a sort would place it, without sorting the vocabulary.
        let mut sorted = logits.clone();
        let (_, &mut kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        logits
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
    let max = greatest(&logits);
    exps(&logits, max, temperature)
}

/// `e^{(l - max) / temperature}` for each logit `l`: a vocabulary's worth every sampled token
/// (twice: the draw's weights and the log-probability), so in the vectorisable [`exp`] (libm's
/// is a call per value: at a 49,152-token vocabulary, 8% of a token of a 135M model on two
/// cores). Its relative error is below 3e-7; below `e^-87` (≈ 1.6e-38, `-inf` included) it is
/// 0, as a masked token's weight must be.
fn exps(logits: &[f32], max: f32, temperature: f32) -> Vec<f64> {
    let mut out = vec![0.0; logits.len()];
    exps_into(&mut out, logits, max, temperature);
    out
}

vectorized! {
    fn exps_into(out: &mut [f64], logits: &[f32], max: f32, temperature: f32) {
        for (o, &l) in out.iter_mut().zip(logits) {
            let x = (l - max) / temperature;
            *o = if x > -87.0 { exp(x) as f64 } else { 0.0 };
        }
    }
}

/// Weights a run of which [`draw`] skips at once where all are 0 (top-k leaves all but a few
/// hundred of a vocabulary so).
const RUN: usize = 64;

/// The first token whose running sum of `weights` passes `uniform` (in `[0, 1)`) times their
/// total; the heaviest where rounding leaves the target past the end.
///
/// A weight of 0 neither moves a sum nor is ever picked (the target never goes below 0), so
/// runs of them are passed over: the same sums, and the same token, as a walk through all.
pub(crate) fn draw(weights: &[f64], uniform: f64) -> u32 {
    let nonzero = |run: &&[f64]| run.iter().fold(false, |any, &w| any | (w != 0.0));
    let total: f64 = weights.chunks(RUN).filter(nonzero).flatten().sum();
    let mut r = uniform * total;
    for (n, run) in weights
        .chunks(RUN)
        .enumerate()
        .filter(|(_, run)| nonzero(run))
    {
        for (i, w) in run.iter().enumerate() {
            if r < *w {
                return (n * RUN + i) as u32;
            }
            r -= w;
        }
    }
    argmax(weights)
}

/// [`argmax`] of a row of logits: the first of the largest (0 if the first is NaN, as
/// `argmax` has it), found in sixteen lanes and then looked for in runs, not compared one by
/// one through the vocabulary.
pub(crate) fn argmax_logits(values: &[f32]) -> u32 {
    if values.first().is_none_or(|v| v.is_nan()) {
        return 0;
    }
    let max = greatest(values);
    let found = |run: &[f32]| run.iter().fold(false, |any, &v| any | (v == max));
    let Some(n) = values.chunks(RUN).position(found) else {
        return argmax(values);
    };
    let run = &values[n * RUN..];
    n as u32 * RUN as u32 + run.iter().position(|&v| v == max).unwrap_or(0) as u32
}

vectorized! {
    /// The largest of `values` (`-inf` for none), a NaN passed over, as
    /// `fold(-inf, f32::max)` finds it, in sixteen lanes.
    pub(crate) fn greatest(values: &[f32]) -> f32 {
        const LANES: usize = 16;
        let mut lanes = [f32::NEG_INFINITY; LANES];
        let chunks = values.chunks_exact(LANES);
        let rest = chunks.remainder();
        for chunk in chunks {
            for l in 0..LANES {
                lanes[l] = lanes[l].max(chunk[l]);
            }
        }
        lanes.iter().chain(rest).copied().fold(f32::NEG_INFINITY, f32::max)
    }
}

vectorized! {
    /// `Σ e^{l - max}` over the logits in `f64` (each term [`exps`]' at temperature 1), summed
    /// in sixteen lanes and then the lanes in order: the log-probabilities' normaliser.
    fn exp_total(logits: &[f32], max: f32) -> f64 {
        const LANES: usize = 16;
        let weight = |l: f32| {
            let x = l - max;
            if x > -87.0 { exp(x) as f64 } else { 0.0 }
        };
        let mut lanes = [0f64; LANES];
        let chunks = logits.chunks_exact(LANES);
        let rest = chunks.remainder();
        for chunk in chunks {
            for l in 0..LANES {
                lanes[l] += weight(chunk[l]);
            }
        }
        lanes.iter().copied().chain(rest.iter().map(|&l| weight(l))).sum()
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised exponentials are libm's to float precision, and exactly 0 for a token
    /// masked out (`-inf`) or top-k's leftovers.
    #[test]
    fn weights_are_the_exponentials_and_masked_tokens_weigh_nothing() {
        let mut logits: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.731).sin() * 20.0).collect();
        logits[7] = f32::NEG_INFINITY;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for temperature in [1.0, 0.7, 2.0] {
            let got = weights(&logits, temperature, None);
            for (i, (&w, &l)) in got.iter().zip(&logits).enumerate() {
                let want = (((l - max) / temperature) as f64).exp();
                assert!((w - want).abs() <= 3e-7 * want, "{i}: {w} vs {want}");
            }
            assert_eq!(got[7], 0.0);
        }
        let top = weights(&logits, 1.0, Some(10));
        assert_eq!(top.iter().filter(|&&w| w > 0.0).count(), 10);
    }

    /// A vocabulary-sized row with ties, zeros of both signs, `-inf` and a NaN inside.
    fn row(seed: u32) -> Vec<f32> {
        let mut row: Vec<f32> = (0..49_157u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) ^ seed) % 2_001) as f32 / 100.0 - 10.0)
            .collect();
        row[3] = f32::NEG_INFINITY;
        row[500] = f32::NAN;
        row[9] = -0.0;
        row
    }

    /// The lanes' maximum, the logits' argmax and the draw over runs give what the plain walks
    /// through the vocabulary give, ties, signed zeros and NaNs included.
    #[test]
    fn the_vocabulary_walks_give_the_plain_walks_answers() {
        for seed in [0, 7, 12_345] {
            let mut row = row(seed);
            let plain = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(greatest(&row), plain);
            assert_eq!(argmax_logits(&row), argmax(&row), "seed {seed}");
            row[49_150] = 10.5; // a lone leader in the last, short run
            assert_eq!(argmax_logits(&row), 49_150);
            row[0] = f32::NAN; // `argmax` keeps a leading NaN
            assert_eq!(argmax_logits(&row), argmax(&row));
        }
        assert_eq!(
            argmax_logits(&[-0.0, 0.0, -1.0]),
            argmax(&[-0.0f32, 0.0, -1.0])
        );
        assert_eq!(argmax_logits(&[]), 0);
        assert_eq!(greatest(&[]), f32::NEG_INFINITY);

        let plain_draw = |weights: &[f64], uniform: f64| {
            let mut r = uniform * weights.iter().sum::<f64>();
            for (i, w) in weights.iter().enumerate() {
                if r < *w {
                    return i as u32;
                }
                r -= w;
            }
            argmax(weights)
        };
        let logits = row(3);
        for top_k in [Some(1), Some(200), Some(5_000), None] {
            let w = weights(&logits, 0.8, top_k);
            for uniform in [0.0, 0.123, 0.5, 0.999_999] {
                assert_eq!(
                    draw(&w, uniform),
                    plain_draw(&w, uniform),
                    "{top_k:?} {uniform}"
                );
            }
        }
        assert_eq!(draw(&[0.0; 100], 0.5), argmax(&[0.0f64; 100]));
    }

    /// Top-k's weights are those of the k-th largest found by a full sort (a NaN, which
    /// `total_cmp` sorts first, included).
    #[test]
    fn top_k_keeps_the_k_largest_as_a_sort_finds_them() {
        let logits = row(5);
        for k in [1, 2, 200, 20_000] {
            let mut sorted = logits.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            let kth = sorted[k - 1];
            let masked: Vec<f32> = logits
                .iter()
                .map(|&l| if l < kth { f32::NEG_INFINITY } else { l })
                .collect();
            let max = masked.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let want = exps(&masked, max, 0.8);
            assert_eq!(weights(&logits, 0.8, Some(k)), want, "k = {k}");
        }
    }

    /// The normaliser summed in lanes is the plain sum of the same terms to `f64` rounding.
    #[test]
    fn the_normaliser_in_lanes_is_the_plain_sum() {
        let logits: Vec<f32> = row(9).into_iter().filter(|l| !l.is_nan()).collect();
        let max = greatest(&logits);
        let plain: f64 = exps(&logits, max, 1.0).iter().sum();
        let lanes = exp_total(&logits, max);
        assert!((lanes - plain).abs() <= 1e-12 * plain, "{lanes} vs {plain}");
    }
}
