//! `POST /v1/completions`: OpenAI's request checked into choices and sampler settings, queued
//! for a worker, and answered whole or streamed, with `logprobs` and `echo` in OpenAI's shapes.

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{ApiError, Usage, json};
use super::fields::{MAX_CHOICES, Refusal, SAMPLER_FIELDS, SamplerFields, parse_checked};
use super::generation::{ChoiceSpec, Generation, TokenLogprob};
use super::pool::Job;
use super::reply::{EVENTS_IN_FLIGHT, Framing, Head, collect, frame, sse};
use super::state::{Shared, State, body, encode_prompt, now, submit};

/// `POST /v1/completions`, OpenAI's fields (the sampler's are in [`SamplerFields`]).
#[derive(Debug, Deserialize)]
pub(crate) struct CompletionRequest {
    pub prompt: Prompt,
    /// Tokens to generate at most (OpenAI's default: 16); 0 with `echo` scores the prompt.
    pub max_tokens: Option<usize>,
    /// Report the log-probability of each token and of this many likely alternatives (0..=5).
    pub logprobs: Option<usize>,
    /// Send the prompt back before the completion (with its logprobs, when asked).
    pub echo: Option<bool>,
    /// Only equal to `n`: tinygpt returns every sample it draws.
    pub best_of: Option<usize>,
    #[serde(flatten)]
    pub sampler: SamplerFields,
}

const FIELDS: &[&str] = &["prompt", "max_tokens", "logprobs", "echo", "best_of"];

const REFUSED: &[Refusal] = &[Refusal::new(
    "suffix",
    "`suffix` is not supported: a GPT continues text at its end and cannot insert text \
     before a suffix",
)];

/// The most alternatives `logprobs` may ask for (OpenAI's limit).
const MAX_LOGPROBS: usize = 5;

/// A prompt: text, token ids, or a list of either (one choice set per prompt).
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "`prompt` must be a string, an array of strings, an array of token ids, or an \
                 array of arrays of token ids"
)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

pub(super) async fn completions(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: CompletionRequest = parse_checked(&raw, &[FIELDS, SAMPLER_FIELDS], REFUSED)?;
    let include_usage = request.sampler.include_usage()?;
    let echo = request.echo.unwrap_or(false);
    let logprobs = logprobs(request.logprobs)?;
    let n = request.sampler.n()?;
    if request.best_of.is_some_and(|b| b != n) {
        return Err(ApiError::invalid(
            "best_of",
            "`best_of` must equal `n`: tinygpt returns every sample it draws instead of ranking \
             them",
        ));
    }
    let max_tokens = max_tokens(&state, request.max_tokens, echo)?;
    let options = request
        .sampler
        .options(&state, max_tokens, &[], logprobs.unwrap_or(0))?;
    let prompts = prompt_ids(&state, request.prompt)?;
    if prompts.len() * n > MAX_CHOICES {
        return Err(ApiError::invalid(
            "n",
            format!("at most {MAX_CHOICES} choices per request (prompts × n)"),
        ));
    }
    let head = Head {
        id: state.completion_id("cmpl"),
        created: now(),
        model: state.name.clone(),
        prompt_tokens: prompts.iter().map(Vec::len).sum(),
    };
    // Where each choice's text starts in OpenAI's `text_offset`: after the prompt unless echoed.
    let offsets: Vec<usize> = prompts
        .iter()
        .flat_map(|p| {
            let start = match echo {
                true => 0,
                false => decoded_chars(&state, p),
            };
            std::iter::repeat_n(start, n)
        })
        .collect();
    let choices = choices(prompts, n, options.seed);
    let count = choices.len();
    let (events, receiver) = mpsc::channel(EVENTS_IN_FLIGHT);
    let generation = Generation {
        choices,
        options,
        echo,
        logprobs: logprobs.is_some(),
    };
    submit(&state, Job::Complete { generation, events })?;
    let framing = Completions {
        head,
        offsets,
        logprobs: logprobs.is_some(),
        include_usage,
        completion_tokens: 0,
    };
    if request.sampler.stream() {
        return Ok(sse(receiver, framing));
    }
    let done = collect(receiver, count).await?;
    Ok(framing.whole(done))
}

/// `n` choices per prompt, in OpenAI's order (all of the first prompt's, then the next's);
/// choice `i` of a prompt samples with `seed + i`, so choice 0 is what `n: 1` gives.
pub(super) fn choices(prompts: Vec<Vec<u32>>, n: usize, seed: u64) -> Vec<ChoiceSpec> {
    prompts
        .into_iter()
        .flat_map(|prompt| {
            (0..n as u64).map(move |i| ChoiceSpec {
                prompt: prompt.clone(),
                seed: seed.wrapping_add(i),
            })
        })
        .collect()
}

fn logprobs(logprobs: Option<usize>) -> Result<Option<usize>, ApiError> {
    match logprobs {
        Some(n) if n > MAX_LOGPROBS => Err(ApiError::invalid(
            "logprobs",
            format!("`logprobs` must be between 0 and {MAX_LOGPROBS}, not {n}"),
        )),
        other => Ok(other),
    }
}

/// `max_tokens`, by default 16; 0 only with `echo` (the prompt is scored, nothing generated).
fn max_tokens(state: &State, asked: Option<usize>, echo: bool) -> Result<usize, ApiError> {
    let limit = state.options.max_tokens;
    match asked.unwrap_or(16) {
        0 if echo => Ok(0),
        n @ 1.. if n <= limit => Ok(n),
        n => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "`max_tokens` must be between 1 and {limit} (this server's --max-tokens), or 0 \
                 with `echo: true`, not {n}"
            ),
        )),
    }
}

/// Each prompt's token ids, checked against the vocabulary and the server's prompt limit.
fn prompt_ids(state: &State, prompt: Prompt) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenizer = state.tokenizer();
    let prompts = match prompt {
        Prompt::Text(text) => vec![encode_prompt(tokenizer, &text, "prompt")?],
        Prompt::Texts(texts) => texts
            .iter()
            .map(|text| encode_prompt(tokenizer, text, "prompt"))
            .collect::<Result<_, _>>()?,
        Prompt::Tokens(ids) => vec![ids],
        Prompt::TokenLists(lists) => lists,
    };
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the list of prompts is empty"));
    }
    for ids in &prompts {
        state.check_prompt(ids, "prompt")?;
    }
    Ok(prompts)
}

fn decoded_chars(state: &State, ids: &[u32]) -> usize {
    state
        .tokenizer()
        .decode(ids)
        .map_or(0, |text| text.chars().count())
}

/// Completions' shapes: `text_completion` objects, whole or as chunks.
struct Completions {
    head: Head,
    /// Per choice: where its next token's text starts (OpenAI's `text_offset`).
    offsets: Vec<usize>,
    logprobs: bool,
    include_usage: bool,
    completion_tokens: usize,
}

impl Completions {
    fn choice(
        &mut self,
        index: usize,
        text: String,
        tokens: &[TokenLogprob],
        reason: Option<&str>,
    ) -> Value {
        let logprobs = self
            .logprobs
            .then(|| logprobs_object(tokens, &mut self.offsets[index]));
        json!({"text": text, "index": index, "logprobs": logprobs, "finish_reason": reason})
    }

    fn whole(mut self, done: Vec<super::reply::Finished>) -> Response {
        let completion_tokens = done.iter().map(|d| d.completion_tokens).sum();
        let choices = done
            .into_iter()
            .enumerate()
            .map(|(index, d)| self.choice(index, d.text, &d.tokens, Some(d.reason)))
            .collect();
        let usage = Usage::new(self.head.prompt_tokens, completion_tokens);
        json(
            StatusCode::OK,
            &self.head.object("text_completion", choices, Some(usage)),
        )
    }
}

impl Framing for Completions {
    fn piece(&mut self, index: usize, text: String, tokens: Vec<TokenLogprob>) -> Vec<u8> {
        let choice = self.choice(index, text, &tokens, None);
        frame(&self.head.object("text_completion", vec![choice], None))
    }

    fn finished(
        &mut self,
        index: usize,
        completion_tokens: usize,
        reason: &'static str,
    ) -> Vec<u8> {
        self.completion_tokens += completion_tokens;
        let choice = json!({"text": "", "index": index, "logprobs": null, "finish_reason": reason});
        frame(&self.head.object("text_completion", vec![choice], None))
    }

    fn end(&mut self) -> Vec<u8> {
        match self.include_usage {
            true => {
                let usage = Usage::new(self.head.prompt_tokens, self.completion_tokens);
                frame(&self.head.object("text_completion", Vec::new(), Some(usage)))
            }
            false => Vec::new(),
        }
    }
}

/// OpenAI's completions `logprobs`: parallel lists of the tokens, their log-probabilities,
/// the most likely alternatives (token text → log-probability) and where each token's text
/// starts, counted in characters from `offset` (which moves past these tokens).
fn logprobs_object(tokens: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut text_offset = Vec::with_capacity(tokens.len());
    for token in tokens {
        text_offset.push(*offset);
        *offset += token.text.chars().count();
    }
    let top: Vec<Value> = tokens
        .iter()
        .map(|t| match t.logprob {
            None => Value::Null,
            Some(_) => Value::Object(
                t.top
                    .iter()
                    .map(|(text, lp)| (text.clone(), json!(lp)))
                    .collect(),
            ),
        })
        .collect();
    json!({
        "tokens": tokens.iter().map(|t| &t.text).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}
