//! The HTTP routes: completions (whole or streamed as server-sent events), models, health,
//! attention, and the playground's files.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State as Extract};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tinygpt_model::GenerateOptions;
use tokio::sync::{mpsc, oneshot};

use super::ServeOptions;
use super::api::{
    ApiError, AttentionRequest, AttentionResponse, Choice, Completion, CompletionRequest, Prompt,
    Usage, json, parse,
};
use super::playground;
use super::pool::{Event, Job, Model, Pool, Refused};
use crate::tokenizer::Tokenizer;

/// What every handler shares.
pub struct State {
    pub name: String,
    pub created: u64,
    model: Arc<Model>,
    pub pool: Pool,
    options: ServeOptions,
    next_id: AtomicU64,
}

impl State {
    pub fn new(name: String, model: &Arc<Model>, pool: Pool, options: ServeOptions) -> Self {
        Self {
            name,
            created: now(),
            model: model.clone(),
            pool,
            options,
            next_id: AtomicU64::new(0),
        }
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    fn block_size(&self) -> usize {
        self.model.gpt.block_size()
    }

    fn completion_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("cmpl-{:x}-{n}", self.created)
    }
}

type Shared = Arc<State>;

/// Pieces of text a generation may run ahead of its client.
const EVENTS_IN_FLIGHT: usize = 64;

pub fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/attention", post(attention))
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/", get(|| async { playground::page() }))
        .route("/playground.js", get(|| async { playground::script() }))
        .route("/playground.css", get(|| async { playground::style() }))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(state.options.max_body_bytes))
        .with_state(state)
}

/// With `--api-key`, every `/v1` request must carry `Authorization: Bearer KEY`.
async fn authorize(
    Extract(state): Extract<Shared>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(key) = &state.options.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given.map(str::trim) != Some(key.as_str()) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing or wrong API key: send `Authorization: Bearer KEY` with the server's \
                 --api-key",
            )
            .with_code("invalid_api_key"));
        }
    }
    Ok(next.run(request).await)
}

/// The body, or the error a client can act on (413 past `--max-body-bytes`).
fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the server's limit of {limit} bytes"),
        ),
        status => ApiError::new(status, rejection.body_text()),
    })
}

async fn completions(
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
    let (prompt, options) = generation(&state, request)?;
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

/// The prompt's ids and the sampler's settings of a request, checked against the model and the
/// server's limits.
fn generation(
    state: &State,
    request: CompletionRequest,
) -> Result<(Vec<u32>, GenerateOptions), ApiError> {
    let limits = &state.options;
    let tokenizer = state.tokenizer();
    let prompt = match request.prompt {
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
    if prompt.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if prompt.len() > limits.max_prompt_tokens {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt is {} tokens; this server takes at most {}",
                prompt.len(),
                limits.max_prompt_tokens
            ),
        ));
    }
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
    let stop = request.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
    }
    let stop = stop
        .iter()
        .map(|s| match s.is_empty() {
            true => Err(ApiError::invalid("stop", "a stop sequence is empty")),
            false => encode(tokenizer, s, "stop"),
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
            tinygpt_model::GenerateError::Temperature(_) => "temperature",
            tinygpt_model::GenerateError::TopP(_) => "top_p",
            tinygpt_model::GenerateError::TopK => "top_k",
            tinygpt_model::GenerateError::RepetitionPenalty(_) => "repetition_penalty",
            _ => "stop",
        };
        ApiError::invalid(param, e.to_string())
    })?;
    Ok((prompt, options))
}

fn encode(tokenizer: &Tokenizer, text: &str, param: &'static str) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text)
        .map_err(|e| ApiError::invalid(param, format!("{param}: {e:#}")))
}

fn submit(state: &State, job: Job) -> Result<(), ApiError> {
    state.pool.submit(job).map_err(|refused| match refused {
        Refused::Busy => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server is busy: {} generations are running and {} waiting; retry shortly",
                state.options.max_concurrent, state.options.queue
            ),
        )
        .with_code("queue_full"),
        Refused::Closed => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping"),
    })
}

/// What every response of one completion shares.
struct Head {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
}

impl Head {
    fn completion(&self, choices: Vec<Choice>, usage: Option<Usage>) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
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

async fn models(Extract(state): Extract<Shared>) -> Response {
    json(
        StatusCode::OK,
        &serde_json::json!({
            "object": "list",
            "data": [{
                "id": state.name,
                "object": "model",
                "created": state.created,
                "owned_by": "tinygpt",
            }],
        }),
    )
}

/// Liveness, the model's shape (for the playground) and the server's counters.
async fn health(Extract(state): Extract<Shared>) -> Response {
    let config = &state.model.gpt.config;
    json(
        StatusCode::OK,
        &serde_json::json!({
            "status": "ok",
            "model": state.name,
            "block_size": config.block_size,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "n_embd": config.n_embd,
            "vocab_size": state.tokenizer().vocab_size(),
            "tokenizer": state.tokenizer().kind(),
            "api_key_required": state.options.api_key.is_some(),
            "max_tokens": state.options.max_tokens,
            "stats": &*state.pool.stats,
        }),
    )
}

async fn attention(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: AttentionRequest = parse(&raw)?;
    let config = &state.model.gpt.config;
    for (param, value, count) in [
        ("layer", request.layer, config.n_layer),
        ("head", request.head, config.n_head),
    ] {
        if let Some(v) = value.filter(|&v| v >= count) {
            return Err(ApiError::invalid(
                param,
                format!(
                    "{param} {v} does not exist: the model has {count} (0..{})",
                    count - 1
                ),
            ));
        }
    }
    let mut ids = encode(state.tokenizer(), &request.prompt, "prompt")?;
    let block = state.block_size();
    let truncated = match request.truncate {
        true => ids.len().saturating_sub(block),
        false => 0,
    };
    ids.drain(..truncated);
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if ids.len() > block {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt is {} tokens but the model's block_size is {block} (send \
                 `truncate: true` to keep the last {block})",
                ids.len()
            ),
        ));
    }
    let (reply, maps) = oneshot::channel();
    submit(
        &state,
        Job::Attention {
            ids: ids.clone(),
            reply,
        },
    )?;
    let maps = maps
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is stopping"))?
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
    let layers: Vec<usize> = (0..config.n_layer)
        .filter(|l| request.layer.is_none_or(|x| x == *l))
        .collect();
    let heads: Vec<usize> = (0..config.n_head)
        .filter(|h| request.head.is_none_or(|x| x == *h))
        .collect();
    let seq = ids.len();
    let attention = layers
        .iter()
        .map(|&l| {
            heads
                .iter()
                .map(|&h| {
                    let matrix = &maps.maps[l][h];
                    (0..seq)
                        .map(|q| {
                            matrix[q * seq..=q * seq + q]
                                .iter()
                                .map(|&w| round(w))
                                .collect()
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let tokens = ids
        .iter()
        .map(|&id| state.tokenizer().decode(&[id]).unwrap_or_default())
        .collect();
    let response = AttentionResponse {
        object: "attention",
        model: state.name.clone(),
        tokens,
        token_ids: ids,
        truncated,
        layers,
        heads,
        attention,
    };
    Ok(json(StatusCode::OK, &response))
}

/// Five decimals are plenty for a heatmap and keep the JSON short.
fn round(w: f32) -> f32 {
    (w * 1e5).round() / 1e5
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
