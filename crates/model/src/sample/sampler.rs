//! Picking one token from a row of logits: the penalties and biases that move the logits
//! (repetition, frequency, presence, `logit_bias`), then temperature, top-k and top-p; and what
//! the model itself thought of the token (its log-probability and the most likely others).

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::device_pick::Pick;
use super::draw::{Sampled, argmax_logits, draw, weights};
use super::options::GenerateOptions;

/// The sampling state of one generation: its random numbers and how often each token has been
/// generated so far (what the frequency and presence penalties count).
pub(crate) struct Sampler {
    options: GenerateOptions,
    rng: StdRng,
    counts: Vec<u32>,
}

impl Sampler {
    pub fn new(options: &GenerateOptions, vocab_size: usize) -> Self {
        Self {
            options: options.clone(),
            rng: StdRng::seed_from_u64(options.seed),
            counts: vec![0; vocab_size],
        }
    }

    /// This token's [`Pick`] for a decoder that picks on its device, drawing its random number:
    /// `None` (and nothing drawn) where the options ask for what only the host sampler does
    /// (penalties, biases, top-p, min-p, alternatives' log-probabilities). Then [`Self::record`] the
    /// token.
    pub fn device_pick(&mut self, vocab: usize) -> Option<Pick> {
        let o = &self.options;
        let host_only = o.repetition_penalty != 1.0
            || o.frequency_penalty != 0.0
            || o.presence_penalty != 0.0
            || !o.logit_bias.is_empty()
            || o.top_p < 1.0
            || o.min_p > 0.0
            || o.top_logprobs > 0;
        if host_only {
            return None;
        }
        // The host sampler draws only above temperature 0; so does this, to stay in step.
        let uniform = match o.temperature {
            0.0 => 0.0,
            _ => self.rng.random::<f64>(),
        };
        Some(Pick {
            temperature: o.temperature,
            top_k: o.top_k,
            uniform,
            vocab,
        })
    }

    /// Counts a token picked elsewhere (by [`Self::device_pick`]) as generated.
    pub fn record(&mut self, id: u32) {
        if let Some(count) = self.counts.get_mut(id as usize) {
            *count += 1;
        }
    }

    /// The token after `context` (the tokens the model saw), picked from `logits`.
    pub fn next(&mut self, logits: &[f32], context: &[u32]) -> Sampled {
        let mut adjusted = logits.to_vec();
        penalise(&mut adjusted, context, &self.counts, &self.options);
        let id = pick(adjusted, &self.options, &mut self.rng);
        self.record(id);
        Sampled::observe(logits, id, self.options.top_logprobs)
    }
}

/// Moves `logits` by the options' penalties and biases:
/// - repetition (CTRL, Hugging Face): a token anywhere in `context` has a positive logit divided
///   by the penalty, a negative one multiplied;
/// - frequency and presence (OpenAI): `logit -= count·frequency + (count > 0)·presence`, where
///   `count` is how often the token was generated so far (the prompt does not count);
/// - `logit_bias`: added as it is (±100 bans or forces a token in practice).
fn penalise(logits: &mut [f32], context: &[u32], counts: &[u32], o: &GenerateOptions) {
    if o.repetition_penalty != 1.0 {
        let mut seen = vec![false; logits.len()];
        for &t in context {
            seen[t as usize] = true;
        }
        for (l, _) in logits.iter_mut().zip(seen).filter(|(_, s)| *s) {
            *l = if *l > 0.0 {
                *l / o.repetition_penalty
            } else {
                *l * o.repetition_penalty
            };
        }
    }
    if o.frequency_penalty != 0.0 || o.presence_penalty != 0.0 {
        for (l, &count) in logits.iter_mut().zip(counts).filter(|(_, c)| **c > 0) {
            *l -= count as f32 * o.frequency_penalty + o.presence_penalty;
        }
    }
    for &(id, bias) in &o.logit_bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += bias;
        }
    }
}

/// Temperature, top-k, min-p and top-p over `logits`, then one draw from `rng` (or the most
/// likely token at temperature 0).
fn pick(logits: Vec<f32>, o: &GenerateOptions, rng: &mut StdRng) -> u32 {
    if o.temperature == 0.0 {
        return argmax_logits(&logits);
    }
    let mut weights = weights(&logits, o.temperature, o.top_k);
    if o.min_p > 0.0 {
        // The most likely token's weight is exp(0) = 1, so a token's weight is its
        // probability relative to the most likely one's.
        let floor = o.min_p as f64;
        weights
            .iter_mut()
            .filter(|w| **w < floor)
            .for_each(|w| *w = 0.0);
    }
    if o.top_p < 1.0 {
        nucleus(&mut weights, o.top_p as f64);
    }
    draw(&weights, rng.random::<f64>())
}

/// Zeroes all but the most likely `probs` whose share of the total reaches `top_p`.
fn nucleus(probs: &mut [f64], top_p: f64) {
    let total: f64 = probs.iter().sum();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_unstable_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let mut cumulative = 0.0;
    let mut keep = order.len();
    for (rank, &i) in order.iter().enumerate() {
        cumulative += probs[i] / total;
        if cumulative >= top_p {
            keep = rank + 1;
            break;
        }
    }
    for &i in &order[keep..] {
        probs[i] = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> GenerateOptions {
        GenerateOptions::default()
    }

    /// One pick after `context`, as a fresh generation makes it.
    fn sample(logits: Vec<f32>, context: &[u32], o: &GenerateOptions, rng: &mut StdRng) -> u32 {
        let mut logits = logits;
        penalise(&mut logits, context, &[0; 8], o);
        pick(logits, o, rng)
    }

    #[test]
    fn greedy_takes_the_first_maximum() {
        let mut rng = StdRng::seed_from_u64(0);
        let o = GenerateOptions {
            temperature: 0.0,
            ..opts()
        };
        assert_eq!(sample(vec![0.1, 3.0, -1.0, 3.0], &[], &o, &mut rng), 1);
    }

    #[test]
    fn top_k_one_and_tiny_top_p_are_greedy() {
        let mut rng = StdRng::seed_from_u64(7);
        let logits = vec![0.5, 0.2, 0.9, 0.1];
        for o in [
            GenerateOptions {
                top_k: Some(1),
                temperature: 5.0,
                ..opts()
            },
            GenerateOptions {
                top_k: None,
                top_p: 1e-6,
                temperature: 5.0,
                ..opts()
            },
        ] {
            for _ in 0..50 {
                assert_eq!(sample(logits.clone(), &[], &o, &mut rng), 2);
            }
        }
    }

    /// How often each of four tokens is drawn in 400 draws from `logits`.
    fn counts(logits: &[f32; 4], o: &GenerateOptions, rng: &mut StdRng) -> [usize; 4] {
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sample(logits.to_vec(), &[], o, rng) as usize] += 1;
        }
        seen
    }

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let mut rng = StdRng::seed_from_u64(3);
        let o = GenerateOptions {
            top_k: Some(2),
            temperature: 10.0,
            ..opts()
        };
        let seen = counts(&[1.0, 0.0, 1.1, 0.9], &o, &mut rng);
        assert_eq!((seen[1], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[0] > 100 && seen[2] > 100, "{seen:?}");
    }

    /// Min-p keeps the tokens at least `min_p` as likely as the best (at temperature 1, the
    /// probability ratio of logits `l` and `max` is `exp(l - max)`): here ratios 1, 0.61, 0.37
    /// and 0.14 with `min_p` 0.5 keep the first two, and a device pick is refused (the device
    /// pick does not implement it).
    #[test]
    fn min_p_never_samples_below_its_share_of_the_best() {
        let mut rng = StdRng::seed_from_u64(5);
        let o = GenerateOptions {
            top_k: None,
            min_p: 0.5,
            temperature: 1.0,
            ..opts()
        };
        let logits = [2.0, 1.5, 1.0, 0.0];
        let seen = counts(&logits, &o, &mut rng);
        assert_eq!((seen[2], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[0] > 150 && seen[1] > 80, "{seen:?}");
        let without = GenerateOptions {
            min_p: 0.0,
            ..o.clone()
        };
        let all = counts(&logits, &without, &mut rng);
        assert!(all[2] > 0 && all[3] > 0, "{all:?}");
        assert!(Sampler::new(&o, 4).device_pick(4).is_none());
        let bad = GenerateOptions {
            min_p: 1.5,
            ..opts()
        };
        assert_eq!(bad.validate(), Err(crate::error::GenerateError::MinP(1.5)));
    }

    #[test]
    fn repetition_penalty_steers_away_from_seen_tokens() {
        let mut rng = StdRng::seed_from_u64(0);
        let o = GenerateOptions {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..opts()
        };
        // token 0 leads (2.0 vs 1.5) but was already used: 2.0 / 2 = 1.0 < 1.5
        assert_eq!(sample(vec![2.0, 1.5, 0.0], &[0], &o, &mut rng), 1);
        // negative logits are multiplied: -0.1 * 2 = -0.2 < -0.15
        assert_eq!(sample(vec![-0.1, -0.15, -3.0], &[0], &o, &mut rng), 1);
    }

    #[test]
    fn frequency_and_presence_penalties_follow_openai() {
        let o = GenerateOptions {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..opts()
        };
        let mut logits = vec![1.0, 1.0, 1.0];
        // token 0 generated 3 times, token 1 once, token 2 never; the context does not count.
        penalise(&mut logits, &[2, 2], &[3, 1, 0], &o);
        assert_eq!(logits, vec![1.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25, 1.0]);
    }

    #[test]
    fn logit_bias_bans_and_forces_tokens() {
        let mut rng = StdRng::seed_from_u64(5);
        let banned = GenerateOptions {
            temperature: 1.0,
            top_k: None,
            logit_bias: vec![(0, -100.0), (1, -100.0)],
            ..opts()
        };
        let forced = GenerateOptions {
            logit_bias: vec![(3, 100.0)],
            ..banned.clone()
        };
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sample(vec![5.0, 4.0, 0.0, -2.0], &[], &banned, &mut rng) as usize] += 1;
            assert_eq!(sample(vec![5.0, 4.0, 0.0, -2.0], &[], &forced, &mut rng), 3);
        }
        // Without the two leaders, 2 and 3 share the draws as e^0 : e^-2.
        assert_eq!((seen[0], seen[1]), (0, 0), "{seen:?}");
        assert!(seen[2] > 300 && seen[3] > 20, "{seen:?}");
    }

    #[test]
    fn observed_logprobs_are_the_log_softmax_of_the_raw_logits() {
        let logits = [2.0f32, -1.0, 0.5, 0.5];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let want = |i: usize| (logits[i] as f64 - z.ln()) as f32;
        let seen = Sampled::observe(&logits, 1, 3);
        assert!((seen.logprob - want(1)).abs() < 1e-6, "{seen:?}");
        let ids: Vec<u32> = seen.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![0, 2, 3], "most likely first, ties by id");
        for (id, lp) in seen.top {
            assert!((lp - want(id as usize)).abs() < 1e-6);
        }
        assert!(Sampled::observe(&logits, 0, 0).top.is_empty());
        assert_eq!(Sampled::observe(&logits, 0, 10).top.len(), 4);
    }

    #[test]
    fn the_sampler_counts_what_it_generated() {
        let o = GenerateOptions {
            temperature: 0.0,
            frequency_penalty: 2.0,
            ..opts()
        };
        let mut sampler = Sampler::new(&o, 3);
        // Token 0 leads by 3: after two picks of it (-2, -4), token 1 wins.
        let picks: Vec<u32> = (0..3)
            .map(|_| sampler.next(&[3.0, 0.0, -5.0], &[]).id)
            .collect();
        assert_eq!(picks, vec![0, 0, 1]);
    }
}
