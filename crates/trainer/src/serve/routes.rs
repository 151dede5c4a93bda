//! The HTTP routes and what they share: the router, the API key check, models, health, the
//! playground's files. Completions and attention have modules of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State as Extract};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};

use super::api::{ApiError, json};
use super::pool::{Job, Model, Pool, Refused};
use super::{ServeOptions, attention, completions, playground};
use crate::tokenizer::Tokenizer;

/// What every handler shares.
pub struct State {
    pub name: String,
    pub created: u64,
    pub model: Arc<Model>,
    pub pool: Pool,
    pub options: ServeOptions,
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

    pub(super) fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    pub(super) fn block_size(&self) -> usize {
        self.model.gpt.block_size()
    }

    /// `--max-prompt-tokens`, by default the model's block_size.
    pub(super) fn max_prompt_tokens(&self) -> usize {
        self.options
            .max_prompt_tokens
            .unwrap_or_else(|| self.block_size())
    }

    pub(super) fn completion_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("cmpl-{:x}-{n}", self.created)
    }
}

pub(super) type Shared = Arc<State>;

pub fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
        .route("/v1/attention", post(attention::attention))
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
pub(super) fn body(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the server's limit of {limit} bytes"),
        ),
        status => ApiError::new(status, rejection.body_text()),
    })
}

pub(super) fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text)
        .map_err(|e| ApiError::invalid(param, format!("{param}: {e:#}")))
}

pub(super) fn submit(state: &State, job: Job) -> Result<(), ApiError> {
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

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
