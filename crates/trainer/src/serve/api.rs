//! The wire format's shared pieces: stop sequences, stream options, usage, the attention
//! request, and errors in OpenAI's JSON error shape.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// One stop sequence or several.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "`stop` must be a string or an array of strings")]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn to_vec(&self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s.clone()],
            Self::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/attention`: the attention weights of every layer and head for a prompt.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AttentionRequest {
    /// Accepted and ignored, as in completions.
    #[serde(default, rename = "model")]
    pub _model: Option<String>,
    pub prompt: String,
    /// Only this layer (default: all).
    #[serde(default)]
    pub layer: Option<usize>,
    /// Only this head (default: all).
    #[serde(default)]
    pub head: Option<usize>,
    /// Keep the last block_size tokens of a longer prompt instead of refusing it.
    #[serde(default)]
    pub truncate: bool,
}

/// The attention response: `attention[i][j]` is layer `layers[i]`, head `heads[j]`, as its
/// rows (query `q` attends to keys `0..=q`, so row `q` has `q + 1` weights: the causal mask's
/// zeros are left out).
#[derive(Debug, Serialize)]
pub(crate) struct AttentionResponse {
    pub object: &'static str,
    pub model: String,
    /// Each token's text.
    pub tokens: Vec<String>,
    pub token_ids: Vec<u32>,
    /// Tokens dropped from the start of the prompt by `truncate`.
    pub truncated: usize,
    pub layers: Vec<usize>,
    pub heads: Vec<usize>,
    pub attention: Vec<Vec<Vec<Vec<f32>>>>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// An error as OpenAI sends it: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 about one request field.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = json(self.status, &self.body());
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            // A generation slot frees within seconds; clients with back-off honour this.
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// `value` as a JSON response with `status`.
pub fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).expect("API types serialise");
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A request body parsed as `T`; the error names what is wrong (a syntax error, an unknown
/// field, a wrong type) in one line.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request has no body: send a JSON object",
        ));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid: {e}"),
        )
    })
}
