//! What every handler shares: the model, the worker pool, the options, and the small steps
//! each request takes (reading its body, encoding text, submitting a job).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;

use super::api::ApiError;
use super::options::ServeOptions;
use super::pool::{Job, Model, Pool, Refused};
use crate::data::tokenizer::Tokenizer;

/// What every handler shares.
pub(crate) struct State {
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
        self.model.config.block_size
    }

    /// `--max-prompt-tokens`, by default the model's block_size.
    pub(super) fn max_prompt_tokens(&self) -> usize {
        self.options
            .max_prompt_tokens
            .unwrap_or_else(|| self.block_size())
    }

    /// A response id, unique in this server's life: `prefix-STARTED-N`.
    pub(super) fn completion_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}-{n}", self.created)
    }

    /// A prompt's ids inside the vocabulary, not empty, and within `--max-prompt-tokens`; the
    /// error names `param`.
    pub(super) fn check_prompt(&self, ids: &[u32], param: &'static str) -> Result<(), ApiError> {
        let vocab = self.tokenizer().vocab_size();
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::invalid(
                param,
                format!("token id {id} is outside the vocabulary of {vocab} tokens"),
            ));
        }
        if ids.is_empty() {
            return Err(ApiError::invalid(param, "the prompt is empty"));
        }
        let limit = self.max_prompt_tokens();
        if ids.len() > limit {
            return Err(ApiError::invalid(
                param,
                format!(
                    "the prompt is {} tokens; this server takes at most {limit}",
                    ids.len()
                ),
            ));
        }
        Ok(())
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

/// A request's text as token ids, each special token it spells read as that token (as
/// transformers and vLLM read prompts); an error names the request's field `param`.
pub(super) fn encode(
    tokenizer: &Tokenizer,
    text: &str,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    field(tokenizer.encode_with_specials(text), param)
}

/// A request's prompt text as token ids: [`encode`], after the token the model's tokenizer
/// starts a text with (an imported Llama-family model's BOS; tinygpt's own add none), as
/// transformers and llama.cpp start a prompt.
pub(super) fn encode_prompt(
    tokenizer: &Tokenizer,
    text: &str,
    param: &'static str,
) -> Result<Vec<u32>, ApiError> {
    field(tokenizer.encode_prompt(text), param)
}

/// Token ids, or the error that made none as the request's field `param`'s.
fn field(ids: anyhow::Result<Vec<u32>>, param: &'static str) -> Result<Vec<u32>, ApiError> {
    ids.map_err(|e| ApiError::invalid(param, format!("{param}: {e:#}")))
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
