//! The HTTP routes: the router, the API key check, models, health, the playground's files.
//! Completions and attention have modules of their own; what they all share is in `state.rs`.

use axum::Router;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State as Extract};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use futures_util::StreamExt;
use subtle::ConstantTimeEq;

use super::api::{ApiError, json};
use super::state::Shared;
use super::{attention, chat, completions, playground, tokenize};

pub(crate) fn router(state: Shared) -> Router {
    let api = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/tokenize", post(tokenize::tokenize))
        .route("/v1/detokenize", post(tokenize::detokenize))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
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
        .layer(middleware::from_fn_with_state(state.clone(), bounded_body))
        .with_state(state)
}

/// How far past `--max-body-bytes` a body is still read, and thrown away, before its 413: a
/// server that closes a connection while the request's bytes are still arriving resets it, and
/// the client may then see the reset instead of the 413, or find its kept-alive connection
/// dead at its next request. A `Content-Length` beyond the two is answered at once.
const READ_PAST_LIMIT: usize = 1 << 20;

/// A request's body, read whole here before any route sees it: a `Content-Length` over
/// `--max-body-bytes` by more than [`READ_PAST_LIMIT`] gets its 413 at once, before anything
/// of it is read or waited for; a body (chunked or not) that grows past the limit gets 413
/// once it has been read to its end (or [`READ_PAST_LIMIT`] past the limit), and one that has
/// not arrived within `--body-timeout` gets 408 (413 where its length already said too large).
async fn bounded_body(
    Extract(state): Extract<Shared>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let limit = state.options.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let over =
        |past: usize| declared.is_some_and(|bytes| bytes > limit.saturating_add(past) as u64);
    if over(READ_PAST_LIMIT) {
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    let timeout = state.options.connections.body_timeout;
    let bytes = match tokio::time::timeout(timeout, read_bounded(body, limit)).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Err(too_large()),
        Err(_) if over(0) => return Err(too_large()),
        Err(_) => {
            state
                .pool
                .stats
                .body_timeouts
                .fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within the server's --body-timeout of {}",
                    humantime::format_duration(timeout)
                ),
            ));
        }
    };
    Ok(next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await)
}

/// `body` if it is at most `limit` bytes; `None` if it is longer (read on, and dropped, to its
/// end or [`READ_PAST_LIMIT`] past the limit) or broke off.
async fn read_bounded(body: Body, limit: usize) -> Option<Bytes> {
    let mut chunks = body.into_data_stream();
    let (mut bytes, mut past) = (Vec::new(), 0);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.ok()?;
        if past == 0 && bytes.len() + chunk.len() <= limit {
            bytes.extend_from_slice(&chunk);
            continue;
        }
        past += chunk.len();
        if past > READ_PAST_LIMIT {
            return None;
        }
    }
    (past == 0).then(|| Bytes::from(bytes))
}

/// With `--api-key`, every API request must carry `Authorization: Bearer KEY`.
async fn authorize(
    Extract(state): Extract<Shared>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(key) = &state.options.api_key
        && !key_matches(bearer_token(request.headers()), key)
    {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: send `Authorization: Bearer KEY` with the server's \
             --api-key",
        )
        .with_code("invalid_api_key"));
    }
    Ok(next.run(request).await)
}

/// The token of an `Authorization: Bearer TOKEN` header; the scheme's case does not matter
/// (RFC 9110).
pub(crate) fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether `given` is `key`, compared in constant time: how much of a guess matches must not
/// show in the answer's timing.
pub(crate) fn key_matches(given: Option<&str>, key: &str) -> bool {
    given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(key.as_bytes())))
}

/// The one model, with what a client needs to count tokens and size prompts in `meta`
/// (llama.cpp's place for it).
async fn models(Extract(state): Extract<Shared>) -> Response {
    let config = &state.model.config;
    json(
        StatusCode::OK,
        &serde_json::json!({
            "object": "list",
            "data": [{
                "id": state.name,
                "object": "model",
                "created": state.created,
                "owned_by": "tinygpt",
                "meta": {
                    "tokenizer": state.tokenizer().kind(),
                    "vocab_size": state.tokenizer().vocab_size(),
                    "n_ctx_train": config.block_size,
                    "block_size": config.block_size,
                    "max_prompt_tokens": state.max_prompt_tokens(),
                    "max_tokens": state.options.max_tokens,
            "max_batch": state.options.max_batch,
                    "n_params": config.num_params(),
                },
            }],
        }),
    )
}

/// Liveness, the model's shape (for the playground) and the server's counters.
async fn health(Extract(state): Extract<Shared>) -> Response {
    let config = &state.model.config;
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
            "max_batch": state.options.max_batch,
            "stats": &*state.pool.stats,
        }),
    )
}
