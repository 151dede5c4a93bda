//! `POST /v1/completions`: a request checked into sampler settings, queued for a worker, and
//! answered whole or streamed as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tinygpt_model::{GenerateError, GenerateOptions};
use tokio::sync::mpsc;

use super::api::{
    ApiError, Choice, Completion, CompletionRequest, Prompt, Stop, Usage, json, parse,
};
use super::pool::{Event, Job};
use super::state::{Shared, State, body, encode, now, submit};
use crate::data::tokenizer::Tokenizer;

/// Pieces of text a generation may run ahead of its client.
const EVENTS_IN_FLIGHT: usize = 64;

pub(super) async fn completions(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: CompletionRequest = parse(&raw)?;
    let stream = request.stream;
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    if request.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    let options = sampler(&state, &request)?;
    let prompt = prompt_ids(state.tokenizer(), request.prompt, state.max_prompt_tokens())?;
    let (sender, events) = mpsc::channel(EVENTS_IN_FLIGHT);
    let prompt_tokens = prompt.len();
    submit(
        &state,
        Job::Complete {
            prompt,
            options,
            events: sender,
        },
    )?;
    let head = Head {
        id: state.completion_id(),
        created: now(),
        model: state.name.clone(),
        prompt_tokens,
    };
    Ok(match stream {
        true => streamed(head, events, include_usage),
        false => whole(head, events).await?,
    })
}

/// The prompt's token ids, checked against the vocabulary and the server's `limit`.
fn prompt_ids(tokenizer: &Tokenizer, prompt: Prompt, limit: usize) -> Result<Vec<u32>, ApiError> {
    let ids = match prompt {
        Prompt::Text(text) => encode(tokenizer, &text, "prompt")?,
        Prompt::Texts(texts) => match texts.as_slice() {
            [text] => encode(tokenizer, text, "prompt")?,
            _ => return Err(ApiError::invalid("prompt", "only one prompt per request")),
        },
        Prompt::Tokens(ids) => {
            let vocab = tokenizer.vocab_size();
            if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {id} is outside the vocabulary of {vocab} tokens"),
                ));
            }
            ids
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if ids.len() > limit {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt is {} tokens; this server takes at most {}",
                ids.len(),
                limit
            ),
        ));
    }
    Ok(ids)
}

/// The sampler's settings of a request, checked against the server's limits; the error names
/// the field.
fn sampler(state: &State, request: &CompletionRequest) -> Result<GenerateOptions, ApiError> {
    let limits = &state.options;
    if request.max_tokens == 0 || request.max_tokens > limits.max_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "`max_tokens` must be between 1 and {} (this server's --max-tokens), not {}",
                limits.max_tokens, request.max_tokens
            ),
        ));
    }
    if request.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only `n: 1` is supported"));
    }
    let stop = request.stop.as_ref().map(Stop::to_vec).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
    }
    let stop = stop
        .iter()
        .map(|s| match s.is_empty() {
            true => Err(ApiError::invalid("stop", "a stop sequence is empty")),
            false => encode(state.tokenizer(), s, "stop"),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let options = GenerateOptions {
        max_new_tokens: request.max_tokens,
        temperature: request.temperature,
        top_k: request.top_k.filter(|&k| k > 0),
        top_p: request.top_p,
        repetition_penalty: request.repetition_penalty,
        seed: request.seed.unwrap_or_else(rand::random),
        stop,
        use_cache: true,
        context_shift: request.context_shift.unwrap_or(limits.context_shift),
    };
    options.validate().map_err(|e| {
        let param = match e {
            GenerateError::Temperature(_) => "temperature",
            GenerateError::TopP(_) => "top_p",
            GenerateError::TopK => "top_k",
            GenerateError::RepetitionPenalty(_) => "repetition_penalty",
            _ => "stop",
        };
        ApiError::invalid(param, e.to_string())
    })?;
    Ok(options)
}

/// What every response of one completion shares.
struct Head {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
}

impl Head {
    /// Borrows the id and model name: a stream builds one per token.
    fn completion(&self, choices: Vec<Choice>, usage: Option<Usage>) -> Completion<'_> {
        Completion {
            id: &self.id,
            object: "text_completion",
            created: self.created,
            model: &self.model,
            choices,
            usage,
        }
    }
}

fn choice(text: String, finish_reason: Option<&'static str>) -> Choice {
    Choice {
        text,
        index: 0,
        logprobs: None,
        finish_reason,
    }
}

/// Waits for the whole completion. If the client goes away meanwhile, this future is dropped
/// with the receiver, which cancels the generation.
async fn whole(head: Head, mut events: mpsc::Receiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(piece) => text.push_str(&piece),
            Event::Finished {
                completion_tokens,
                reason,
            } => {
                let usage = Usage::new(head.prompt_tokens, completion_tokens);
                let completion = head.completion(vec![choice(text, Some(reason))], Some(usage));
                return Ok(json(StatusCode::OK, &completion));
            }
            Event::Failed(message) => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message));
            }
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the generation ended without a result",
    ))
}

/// Server-sent events: a `data: {chunk}` per piece of text, a last chunk with the
/// `finish_reason` (and one with `usage` if asked), then `data: [DONE]`. When the client goes
/// away, hyper drops this stream and with it the receiver, which cancels the generation.
fn streamed(head: Head, events: mpsc::Receiver<Event>, include_usage: bool) -> Response {
    let head = Arc::new(head);
    let stream = futures_util::stream::unfold(Some(events), move |events| {
        let head = head.clone();
        async move {
            let mut events = events?;
            let (bytes, more) = match events.recv().await? {
                Event::Text(piece) => (
                    frame(&head.completion(vec![choice(piece, None)], None)),
                    true,
                ),
                Event::Finished {
                    completion_tokens,
                    reason,
                } => {
                    let last = choice(String::new(), Some(reason));
                    let mut out = frame(&head.completion(vec![last], None));
                    if include_usage {
                        let usage = Usage::new(head.prompt_tokens, completion_tokens);
                        out.extend(frame(&head.completion(Vec::new(), Some(usage))));
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    (out, false)
                }
                Event::Failed(message) => {
                    let error = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message);
                    let mut out = frame(&error.body());
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    (out, false)
                }
            };
            let next = more.then_some(events);
            Some((Ok::<_, Infallible>(Bytes::from(bytes)), next))
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// One server-sent event.
fn frame(value: &impl serde::Serialize) -> Vec<u8> {
    let json = serde_json::to_string(value).expect("API types serialise");
    format!("data: {json}\n\n").into_bytes()
}
