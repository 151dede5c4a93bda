//! What a completion job asks of the workers ([`Generation`]) and what they report
//! ([`Event`]): each choice's prompt echoed (and scored) when asked, then continued, its text
//! and log-probabilities sent as events as they come.

use tinygpt_model::{Decoder, GenerateOptions, Sampled, score};

use crate::data::tokenizer::Tokenizer;

/// What a request asks the model for: one or more choices, each a prompt and a seed, sampled
/// with the same settings.
#[derive(Debug)]
pub(crate) struct Generation {
    pub choices: Vec<ChoiceSpec>,
    /// The sampler's settings; `seed` is each choice's own, `max_new_tokens` may be 0 (score
    /// the prompt only, with `echo`).
    pub options: GenerateOptions,
    /// Send each choice's prompt back first (OpenAI's `echo`).
    pub echo: bool,
    /// Report each token's log-probability (and `options.top_logprobs` alternatives).
    pub logprobs: bool,
}

/// One choice: its prompt and its sampler's seed.
#[derive(Debug)]
pub(crate) struct ChoiceSpec {
    pub prompt: Vec<u32>,
    pub seed: u64,
}

/// A token as the client sees it: its text, its log-probability (none for a prompt's first
/// token, which nothing predicts) and the most likely tokens at its place.
#[derive(Debug, Clone)]
pub(crate) struct TokenLogprob {
    pub text: String,
    pub logprob: Option<f32>,
    pub top: Vec<(String, f32)>,
}

/// What a completion job reports, choice by choice (`index`).
#[derive(Debug)]
pub enum Event {
    /// Text of choice `index`, with the tokens it came from when log-probabilities were asked.
    Piece {
        index: usize,
        text: String,
        tokens: Vec<TokenLogprob>,
    },
    Finished {
        index: usize,
        completion_tokens: usize,
        /// OpenAI's `finish_reason`: "stop" (a stop sequence) or "length" (`max_tokens`).
        reason: &'static str,
    },
    Failed(String),
}

/// The prompt as text, with each token's log-probability when asked (one forward over it).
pub(super) fn echo(
    decoder: &mut dyn Decoder,
    tokenizer: &Tokenizer,
    job: &Generation,
    index: usize,
    prompt: &[u32],
) -> Result<Event, String> {
    let text = tokenizer.decode(prompt).map_err(|e| format!("{e:#}"))?;
    let mut tokens = Vec::new();
    if job.logprobs {
        let scored = score(decoder, prompt, job.options.top_logprobs).map_err(|e| e.to_string())?;
        tokens.push(TokenLogprob {
            text: tokenizer.piece(prompt[0]),
            logprob: None,
            top: Vec::new(),
        });
        tokens.extend(scored.iter().map(|s| described(tokenizer, s)));
    }
    Ok(Event::Piece {
        index,
        text,
        tokens,
    })
}

/// `sampled` with its tokens as text.
pub(super) fn described(tokenizer: &Tokenizer, sampled: &Sampled) -> TokenLogprob {
    TokenLogprob {
        text: tokenizer.piece(sampled.id),
        logprob: Some(sampled.logprob),
        top: sampled
            .top
            .iter()
            .map(|&(id, lp)| (tokenizer.piece(id), lp))
            .collect(),
    }
}
