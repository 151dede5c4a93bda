//! Sampling text from any [`Decoder`] (the sampler's settings, stop sequences, the sliding
//! window), and scoring a text with it (each token's log-probability, OpenAI's `echo`).

use std::ops::ControlFlow;

use super::continuation::Continuation;
use super::device_pick::{Pick, Picked};
use super::draw::Sampled;
use super::options::GenerateOptions;
use crate::error::{GenerateError, ModelError};

/// How a recorded step runs again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// One device graph: every launch of the closure in one.
    Graph,
    /// The closure runs again, launch by launch: `why` the device made no graph of it (a
    /// backend without graphs, or a recording it refused).
    Rerun { why: String },
}

/// A model [`generate`] can sample from: it keeps the keys and values of the tokens fed so far
/// (a KV cache of one sequence) and gives the logits of the token after them.
///
/// [`Gpt`](crate::Gpt) on any Burn backend is one ([`Gpt::decoder`](crate::Gpt::decoder));
/// [`FusedDecoder`](crate::FusedDecoder) is another, the same forward pass written out for the
/// CPU.
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

    /// Whether [`generate`] should hand this decoder the pick of each token
    /// ([`Decoder::feed_and_pick`]) when the options allow it, instead of reading the logits:
    /// true where the logits live on a GPU.
    fn picks_on_device(&self) -> bool {
        false
    }

    /// [`Decoder::feed`], then picks the next token by `pick` where the logits are. The
    /// default reads the logits and picks on the host ([`Pick::on_host`]).
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        Ok(pick.on_host(&self.feed(tokens)?))
    }

    /// Once its step of one token has been recorded for replay (a GPU): whether the device
    /// replays it as one graph, or runs its launches again and why. `None` before, and where
    /// nothing is recorded.
    fn replays(&self) -> Option<Replay> {
        None
    }
}

/// A decoder lent out is a decoder.
impl<D: Decoder + ?Sized> Decoder for &mut D {
    fn block_size(&self) -> usize {
        (**self).block_size()
    }
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }
    fn cached(&self) -> usize {
        (**self).cached()
    }
    fn clear(&mut self) {
        (**self).clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        (**self).feed(tokens)
    }
    fn picks_on_device(&self) -> bool {
        (**self).picks_on_device()
    }
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        (**self).feed_and_pick(tokens, pick)
    }
    fn replays(&self) -> Option<Replay> {
        (**self).replays()
    }
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
    generate_cancellable(decoder, prompt, options, |token| {
        on_token(token.id);
        ControlFlow::Continue(())
    })
}

/// [`generate`], with each token's [`Sampled`] log-probabilities, which `on_token` can stop
/// early by returning [`ControlFlow::Break`] (a client that went away): the tokens generated
/// so far are returned.
pub fn generate_cancellable(
    decoder: &mut (impl Decoder + ?Sized),
    prompt: &[u32],
    options: &GenerateOptions,
    mut on_token: impl FnMut(&Sampled) -> ControlFlow<()>,
) -> Result<Vec<u32>, GenerateError> {
    let mut c = Continuation::new(prompt, options, decoder.block_size(), decoder.vocab_size())?;
    decoder.clear();
    while c.finished().is_none() {
        let feed = c.feed(decoder.cached());
        if feed.clear {
            decoder.clear();
        }
        let pick = match decoder.picks_on_device() {
            true => c.device_pick(),
            false => None,
        };
        let fed = &c.tokens()[feed.from..];
        let ready = match pick {
            Some(pick) => {
                let picked = decoder.feed_and_pick(fed, &pick)?;
                c.accept_picked(picked)?
            }
            None => {
                let logits = decoder.feed(fed)?;
                c.accept(&logits)?
            }
        };
        if c.sampled()[ready].iter().any(|t| on_token(t).is_break()) {
            return Ok(c.cancel());
        }
    }
    Ok(c.into_tokens())
}

/// What the model thinks of `tokens`: for each token after the first, its log-probability given
/// the tokens before it (at most `block_size` of them: past that the window slides by one, as
/// in [`generate`]), with the `top` most likely tokens at that place. `[i]` is about
/// `tokens[i + 1]`; the sum of the log-probabilities is minus the text's total cross-entropy.
pub fn score(
    decoder: &mut (impl Decoder + ?Sized),
    tokens: &[u32],
    top: usize,
) -> Result<Vec<Sampled>, GenerateError> {
    GenerateOptions::default().check(tokens, decoder.vocab_size())?;
    decoder.clear();
    let mut window_start = 0;
    let mut scored = Vec::with_capacity(tokens.len().saturating_sub(1));
    for next in 1..tokens.len() {
        let start = next.saturating_sub(decoder.block_size());
        if start != window_start {
            decoder.clear();
            window_start = start;
        }
        let fed = start + decoder.cached();
        let logits = finite(decoder.feed(&tokens[fed..next])?, next - 1)?;
        scored.push(Sampled::observe(&logits, tokens[next], top));
    }
    Ok(scored)
}

/// `logits` of the token after `position`, or the error that says the model is damaged.
fn finite(logits: Vec<f32>, position: usize) -> Result<Vec<f32>, GenerateError> {
    match logits.iter().all(|l| l.is_finite()) {
        true => Ok(logits),
        false => Err(GenerateError::NonFiniteLogits { position }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::continuation::held_back;

    fn opts() -> GenerateOptions {
        GenerateOptions::default()
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
