//! What every handler shares: the model, the worker pool, the options, and the small steps
//! each request takes (reading its body, encoding text, submitting a job).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::ServeOptions;
use super::api::ApiError;
use super::pool::{Job, Model, Pool, Refused};
use crate::data::tokenizer::Tokenizer;

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

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
