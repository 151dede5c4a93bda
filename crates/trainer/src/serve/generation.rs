//! One completion job on a worker thread: each choice's prompt echoed (and scored) when asked,
//! then continued, its text and log-probabilities sent as events as they come.

use std::ops::ControlFlow;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;
use std::time::Instant;

use tinygpt_model::{Decoder, GenerateOptions, Sampled, generate_cancellable, score};
use tokio::sync::mpsc;

use super::stats::Stats;
use crate::data::tokenizer::{TextStream, Tokenizer};

/// What a request asks the model for: one or more choices, each a prompt and a seed, sampled
/// with the same settings.
#[derive(Debug)]
pub struct Generation {
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
pub struct ChoiceSpec {
    pub prompt: Vec<u32>,
    pub seed: u64,
}

/// A token as the client sees it: its text, its log-probability (none for a prompt's first
/// token, which nothing predicts) and the most likely tokens at its place.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
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

/// Runs every choice of `job` in turn on `decoder`; stops early when the client is gone.
pub fn run(
    decoder: &mut dyn Decoder,
    tokenizer: &Tokenizer,
    job: &Generation,
    events: &mpsc::Sender<Event>,
    stats: &Stats,
) {
    let started = Instant::now();
    let mut generated = 0;
    for (index, choice) in job.choices.iter().enumerate() {
        if events.is_closed() {
            break;
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            run_choice(decoder, tokenizer, job, index, choice, events, stats)
        }));
        match outcome {
            Ok(Ok(tokens)) => generated += tokens,
            Ok(Err(message)) => {
                stats.failed.fetch_add(1, Ordering::SeqCst);
                let _ = events.blocking_send(Event::Failed(message));
                return;
            }
            Err(_) => {
                stats.failed.fetch_add(1, Ordering::SeqCst);
                eprintln!("serve: internal error during generation (a bug in tinygpt)");
                let _ =
                    events.blocking_send(Event::Failed("internal error during generation".into()));
                return;
            }
        }
    }
    if events.is_closed() {
        stats.cancelled.fetch_add(1, Ordering::SeqCst);
        eprintln!(
            "serve: cancelled after {generated} tokens in {:.2} s (the client went away or stopped reading)",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    stats.completed.fetch_add(1, Ordering::SeqCst);
    let prompts: usize = job.choices.iter().map(|c| c.prompt.len()).sum();
    eprintln!(
        "serve: {prompts} prompt + {generated} tokens in {:.2} s ({} choice{})",
        started.elapsed().as_secs_f64(),
        job.choices.len(),
        if job.choices.len() == 1 { "" } else { "s" }
    );
}

/// One choice: the echo, the continuation, then [`Event::Finished`] (unless the client went
/// away). Returns the tokens generated.
fn run_choice(
    decoder: &mut dyn Decoder,
    tokenizer: &Tokenizer,
    job: &Generation,
    index: usize,
    choice: &ChoiceSpec,
    events: &mpsc::Sender<Event>,
    stats: &Stats,
) -> Result<usize, String> {
    if job.echo {
        let piece = echo(decoder, tokenizer, job, index, &choice.prompt)?;
        if events.blocking_send(piece).is_err() {
            return Ok(0);
        }
    }
    let options = GenerateOptions {
        seed: choice.seed,
        ..job.options.clone()
    };
    let mut text = TextStream::new(tokenizer);
    let mut pending: Vec<TokenLogprob> = Vec::new();
    let mut gone = false;
    let send = |text: String, tokens: Vec<TokenLogprob>| {
        events
            .blocking_send(Event::Piece {
                index,
                text,
                tokens,
            })
            .is_ok()
    };
    let tokens = match options.max_new_tokens {
        0 => Vec::new(),
        _ => generate_cancellable(decoder, &choice.prompt, &options, |token| {
            stats.tokens.fetch_add(1, Ordering::Relaxed);
            if job.logprobs {
                pending.push(described(tokenizer, token));
            }
            let sent = match text.push(token.id) {
                Some(piece) => send(piece, std::mem::take(&mut pending)),
                None => !events.is_closed(),
            };
            gone = !sent;
            match sent {
                true => ControlFlow::Continue(()),
                false => ControlFlow::Break(()),
            }
        })
        .map_err(|e| e.to_string())?,
    };
    if gone {
        return Ok(tokens.len());
    }
    let rest = text.finish();
    if (rest.is_some() || !pending.is_empty()) && !send(rest.unwrap_or_default(), pending) {
        return Ok(tokens.len());
    }
    let reason = match tokens.len() < options.max_new_tokens {
        true => "stop",
        false => "length",
    };
    let _ = events.blocking_send(Event::Finished {
        index,
        completion_tokens: tokens.len(),
        reason,
    });
    Ok(tokens.len())
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
