//! `POST /v1/tokenize` and `/v1/detokenize` (llama.cpp's shapes, also at `/tokenize` and
//! `/detokenize`): so a client can count tokens or see them, with this model's tokenizer.

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::api::{ApiError, json, parse};
use super::state::{Shared, body, encode, encode_prompt};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizeRequest {
    pub content: String,
    /// Start with the token the model's tokenizer starts a prompt with (an imported
    /// Llama-family model's BOS), as llama.cpp's `add_special` does.
    #[serde(default)]
    pub add_special: bool,
    /// Return `{"id", "piece"}` per token instead of bare ids.
    #[serde(default)]
    pub with_pieces: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// `{"tokens": [ids]}`, or `{"tokens": [{"id", "piece"}]}` with `with_pieces`.
pub(super) async fn tokenize(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: TokenizeRequest = parse(&raw)?;
    let tokenizer = state.tokenizer();
    let ids = match request.add_special {
        true => encode_prompt(tokenizer, &request.content, "content")?,
        false => encode(tokenizer, &request.content, "content")?,
    };
    if !request.with_pieces {
        return Ok(json(StatusCode::OK, &json!({"tokens": ids})));
    }
    let pieces: Vec<_> = ids
        .iter()
        .map(|&id| json!({"id": id, "piece": tokenizer.piece(id)}))
        .collect();
    Ok(json(StatusCode::OK, &json!({"tokens": pieces})))
}

/// `{"content": text}` of the ids, each inside the vocabulary.
pub(super) async fn detokenize(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: DetokenizeRequest = parse(&raw)?;
    let vocab = state.tokenizer().vocab_size();
    if let Some(id) = request.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token id {id} is outside the vocabulary of {vocab} tokens"),
        ));
    }
    let content = state
        .tokenizer()
        .decode(&request.tokens)
        .map_err(|e| ApiError::invalid("tokens", format!("{e:#}")))?;
    Ok(json(StatusCode::OK, &json!({"content": content})))
}
