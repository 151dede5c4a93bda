//! Sampling text from a [`Gpt`]: temperature, top-k, top-p, repetition penalty, stop sequences.

use std::ops::ControlFlow;

use burn::tensor::{Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tinygpt_attention::KvCache;

use crate::error::{GenerateError, ModelError};
use crate::gpt::Gpt;

/// How [`Gpt::generate`] picks each next token.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to sample (fewer if a stop sequence appears).
    pub max_new_tokens: usize,
    /// Divides the logits: < 1 sharper, > 1 flatter; 0 = greedy (always the most likely token).
    pub temperature: f32,
    /// Sample only among the `k` most likely tokens.
    pub top_k: Option<usize>,
    /// Nucleus sampling: only among the most likely tokens whose probabilities add up to `top_p`
    /// (1 = off).
    pub top_p: f32,
    /// Divides positive (multiplies negative) logits of tokens already in the context, as in
    /// CTRL and Hugging Face; 1 = off.
    pub repetition_penalty: f32,
    /// Seed of the sampler: same seed, same model, same backend → same text.
    pub seed: u64,
    /// Token sequences that end generation; they are not returned or streamed.
    pub stop: Vec<Vec<u32>>,
    /// Reuse keys/values across steps (a [`KvCache`] per layer). Off recomputes the whole
    /// context at every step, as nanoGPT's `generate` does; both give the same tokens.
    pub use_cache: bool,
    /// Once the context fills `block_size`, keep only its last half and feed on through the
    /// cache, instead of sliding the window by one token and rebuilding the cache at every
    /// step. Much faster past `block_size`, but no longer nanoGPT's exact rule (the model sees
    /// between half a block and a whole block of context), so it is off by default.
    pub context_shift: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            max_new_tokens: 500,
            temperature: 0.8,
            top_k: Some(200),
            top_p: 1.0,
            repetition_penalty: 1.0,
            seed: 1337,
            stop: Vec::new(),
            use_cache: true,
            context_shift: false,
        }
    }
}

impl GenerateOptions {
    /// Checks every option; the error names the bad one.
    pub fn validate(&self) -> Result<(), GenerateError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(GenerateError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(GenerateError::TopP(self.top_p));
        }
        if self.top_k == Some(0) {
            return Err(GenerateError::TopK);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(GenerateError::RepetitionPenalty(self.repetition_penalty));
        }
        if self.stop.iter().any(Vec::is_empty) {
            return Err(GenerateError::EmptyStop);
        }
        Ok(())
    }
}

/// A model [`generate`] can sample from: it keeps the keys and values of the tokens fed so far
/// (a KV cache of one sequence) and gives the logits of the token after them.
///
/// [`Gpt`] on any Burn backend is one ([`Gpt::generate`]); `FusedDecoder` is another, the same
/// forward pass written out for the CPU.
pub trait Decoder {
    /// The longest context, in tokens.
    fn block_size(&self) -> usize;
    /// Token ids run from 0 to `vocab_size - 1`.
    fn vocab_size(&self) -> usize;
    /// How many tokens the cache holds.
    fn cached(&self) -> usize;
    /// Empties the cache.
    fn clear(&mut self);
    /// Runs `tokens` (at least one) at the positions after the cached ones, adds them to the
    /// cache, and returns the logits `[vocab_size]` of the token that follows the last.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError>;
}

/// Continues `prompt` by up to `options.max_new_tokens` tokens, calling `on_token` with each one
/// as soon as it is sampled (tokens that might begin a stop sequence are held back until they
/// turn out not to). Returns the generated tokens, without the prompt or stop sequence.
///
/// The context is the last `block_size` tokens. While it fits, each step feeds one token
/// through the KV cache; once the window slides, every position embedding shifts, so the cache
/// is rebuilt from the window (the same computation as without a cache). Without
/// `options.use_cache`, every step rebuilds it, as nanoGPT's `generate` does; with
/// `options.context_shift`, the cache is rebuilt only once per half window.
pub fn generate(
    decoder: &mut (impl Decoder + ?Sized),
    prompt: &[u32],
    options: &GenerateOptions,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<u32>, GenerateError> {
    generate_cancellable(decoder, prompt, options, |id| {
        on_token(id);
        ControlFlow::Continue(())
    })
}

/// [`generate`], which `on_token` can stop early by returning [`ControlFlow::Break`] (a
/// client that went away): the tokens generated so far are returned.
pub fn generate_cancellable(
    decoder: &mut (impl Decoder + ?Sized),
    prompt: &[u32],
    options: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> ControlFlow<()>,
) -> Result<Vec<u32>, GenerateError> {
    options.validate()?;
    if prompt.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let vocab_size = decoder.vocab_size();
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(ModelError::TokenOutOfRange {
            id: id.into(),
            vocab_size,
        }
        .into());
    }
    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut tokens = prompt.to_vec();
    // Where the window the cache holds starts in `tokens`.
    let mut window_start = 0;
    decoder.clear();
    let mut generated: Vec<u32> = Vec::new();
    let mut streamed = 0;
    for _ in 0..options.max_new_tokens {
        let start = window(tokens.len(), window_start, decoder.block_size(), options);
        if start != window_start || !options.use_cache {
            decoder.clear();
            window_start = start;
        }
        let fed = start + decoder.cached();
        let logits = decoder.feed(&tokens[fed..])?;
        if !logits.iter().all(|l| l.is_finite()) {
            return Err(GenerateError::NonFiniteLogits {
                position: tokens.len() - 1,
            });
        }
        let next = sample(logits, &tokens[start..], options, &mut rng);
        tokens.push(next);
        generated.push(next);
        if let Some(stop) = options.stop.iter().find(|s| generated.ends_with(s)) {
            generated.truncate(generated.len() - stop.len());
            break;
        }
        let hold = held_back(&generated[streamed..], &options.stop);
        let ready = generated.len() - hold;
        let flow = generated[streamed..ready]
            .iter()
            .try_for_each(|&t| on_token(t));
        streamed = ready;
        if flow.is_break() {
            generated.truncate(streamed);
            return Ok(generated);
        }
    }
    let _ = generated[streamed..].iter().try_for_each(|&t| on_token(t));
    Ok(generated)
}

/// Where the context of the next step starts in a sequence of `len` tokens whose cached window
/// starts at `current`: the last `block_size` tokens (sliding by one, nanoGPT's rule), or with
/// [`GenerateOptions::context_shift`] the same start until the window is full, then the last
/// half block.
fn window(len: usize, current: usize, block_size: usize, options: &GenerateOptions) -> usize {
    let sliding = len.saturating_sub(block_size);
    if !options.context_shift || !options.use_cache {
        return sliding;
    }
    match len - current > block_size {
        true => len - (block_size / 2).max(1),
        false => current.max(sliding),
    }
}

impl Gpt {
    /// [`generate`] from this model, on its device: [`Gpt::decoder`].
    pub fn generate(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32),
    ) -> Result<Vec<u32>, GenerateError> {
        generate(&mut self.decoder(), prompt, options, on_token)
    }

    /// A [`Decoder`] that runs this model with Burn's tensor ops on its device, a [`KvCache`] per
    /// layer.
    pub fn decoder(&self) -> impl Decoder + '_ {
        GptDecoder {
            gpt: self,
            caches: self.new_caches(),
        }
    }
}

/// A [`Gpt`] and its per-layer KV caches.
struct GptDecoder<'a> {
    gpt: &'a Gpt,
    caches: Vec<KvCache>,
}

impl Decoder for GptDecoder<'_> {
    fn block_size(&self) -> usize {
        self.gpt.block_size()
    }

    fn vocab_size(&self) -> usize {
        self.gpt.vocab_size()
    }

    fn cached(&self) -> usize {
        self.caches.first().map_or(0, KvCache::len)
    }

    fn clear(&mut self) {
        self.caches.iter_mut().for_each(KvCache::clear);
    }

    /// Ids are not range-checked on the device: [`generate`] checked the prompt, and sampled ids
    /// are in range.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let ids: Vec<i64> = tokens.iter().map(|&id| id.into()).collect();
        let ids = Tensor::from_data(
            TensorData::new(ids, [1, tokens.len()]),
            &self.gpt.wte.weight.device(),
        );
        let logits = self.gpt.forward_cached(ids, &mut self.caches)?;
        Ok(last_row(logits))
    }
}

/// The last position's logits of `[1, seq, vocab]`.
fn last_row(logits: Tensor<3>) -> Vec<f32> {
    let [_, seq, vocab] = logits.dims();
    logits
        .slice([0..1, seq - 1..seq, 0..vocab])
        .into_data()
        .try_to_vec_as::<f32>()
        .expect("logits convert to f32")
}

/// How many trailing tokens of `pending` could still grow into a stop sequence.
fn held_back(pending: &[u32], stops: &[Vec<u32>]) -> usize {
    (1..=pending.len())
        .rev()
        .find(|&n| {
            let tail = &pending[pending.len() - n..];
            stops.iter().any(|s| s.len() > n && s.starts_with(tail))
        })
        .unwrap_or(0)
}

/// Picks the next token from `logits` (one per vocabulary entry).
fn sample(mut logits: Vec<f32>, context: &[u32], o: &GenerateOptions, rng: &mut StdRng) -> u32 {
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
    if o.temperature == 0.0 {
        return argmax(&logits);
    }
    if let Some(k) = o.top_k.filter(|&k| k < logits.len()) {
        let mut sorted = logits.clone();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        logits
            .iter_mut()
            .filter(|l| **l < kth)
            .for_each(|l| *l = f32::NEG_INFINITY);
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / o.temperature) as f64).exp())
        .collect();
    if o.top_p < 1.0 {
        let total: f64 = probs.iter().sum();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_unstable_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        let mut cumulative = 0.0;
        let mut keep = order.len();
        for (rank, &i) in order.iter().enumerate() {
            cumulative += probs[i] / total;
            if cumulative >= o.top_p as f64 {
                keep = rank + 1;
                break;
            }
        }
        for &i in &order[keep..] {
            probs[i] = 0.0;
        }
    }
    let total: f64 = probs.iter().sum();
    let mut r = rng.random::<f64>() * total;
    for (i, p) in probs.iter().enumerate() {
        if r < *p {
            return i as u32;
        }
        r -= p;
    }
    argmax(&logits)
}

fn argmax(values: &[f32]) -> u32 {
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

    fn opts() -> GenerateOptions {
        GenerateOptions::default()
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

    #[test]
    fn top_k_never_samples_outside_the_k_best() {
        let mut rng = StdRng::seed_from_u64(3);
        let o = GenerateOptions {
            top_k: Some(2),
            temperature: 10.0,
            ..opts()
        };
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[sample(vec![1.0, 0.0, 1.1, 0.9], &[], &o, &mut rng) as usize] += 1;
        }
        assert_eq!((seen[1], seen[3]), (0, 0), "{seen:?}");
        assert!(seen[0] > 100 && seen[2] > 100, "{seen:?}");
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

    /// A decoder whose logits turn NaN once the context reaches `bad_from` tokens.
    struct Diverged {
        cached: usize,
        bad_from: usize,
    }

    impl Decoder for Diverged {
        fn block_size(&self) -> usize {
            16
        }
        fn vocab_size(&self) -> usize {
            3
        }
        fn cached(&self) -> usize {
            self.cached
        }
        fn clear(&mut self) {
            self.cached = 0;
        }
        fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
            self.cached += tokens.len();
            let value = if self.cached >= self.bad_from {
                f32::NAN
            } else {
                0.0
            };
            Ok(vec![1.0, value, 0.5])
        }
    }

    #[test]
    fn non_finite_logits_are_an_error_not_text() {
        let mut decoder = Diverged {
            cached: 0,
            bad_from: 4,
        };
        let mut streamed = Vec::new();
        let o = GenerateOptions {
            temperature: 0.0,
            max_new_tokens: 10,
            ..opts()
        };
        let err = generate(&mut decoder, &[0, 0], &o, |t| streamed.push(t)).unwrap_err();
        assert_eq!(err, GenerateError::NonFiniteLogits { position: 3 });
        assert_eq!(
            streamed,
            vec![0, 0],
            "tokens before the damage were streamed"
        );
    }

    #[test]
    fn stop_prefixes_are_held_back() {
        let stops = vec![vec![5, 6, 7]];
        assert_eq!(held_back(&[1, 2, 5], &stops), 1);
        assert_eq!(held_back(&[1, 5, 6], &stops), 2);
        assert_eq!(held_back(&[1, 2, 3], &stops), 0);
        assert_eq!(held_back(&[5, 6, 8], &stops), 0);
    }

    #[test]
    fn invalid_options_are_errors() {
        let bad = |o: GenerateOptions| o.validate().unwrap_err();
        assert_eq!(
            bad(GenerateOptions {
                top_p: 0.0,
                ..opts()
            }),
            GenerateError::TopP(0.0)
        );
        assert_eq!(
            bad(GenerateOptions {
                top_p: 1.5,
                ..opts()
            }),
            GenerateError::TopP(1.5)
        );
        assert_eq!(
            bad(GenerateOptions {
                temperature: -1.0,
                ..opts()
            }),
            GenerateError::Temperature(-1.0)
        );
        assert_eq!(
            bad(GenerateOptions {
                top_k: Some(0),
                ..opts()
            }),
            GenerateError::TopK
        );
        assert_eq!(
            bad(GenerateOptions {
                stop: vec![vec![]],
                ..opts()
            }),
            GenerateError::EmptyStop
        );
        assert!(opts().validate().is_ok());
    }
}
