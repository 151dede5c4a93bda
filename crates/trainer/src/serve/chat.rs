//! `POST /v1/chat/completions`: the messages written out through the server's chat template,
//! continued as a completion, and answered in OpenAI's chat shapes (`message`, or `delta`
//! chunks when streamed).

use axum::body::Bytes;
use axum::extract::State as Extract;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{ApiError, Usage, json};
use super::completions::choices;
use super::fields::{Refusal, SAMPLER_FIELDS, SamplerFields, parse_checked};
use super::generation::{Generation, TokenLogprob};
use super::pool::Job;
use super::reply::{EVENTS_IN_FLIGHT, Finished, Framing, Head, collect, frame, sse};
use super::state::{Shared, State, body, encode, now, submit};
use crate::chat::Message;

/// `POST /v1/chat/completions`, OpenAI's fields (the sampler's are in [`SamplerFields`]).
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    pub messages: Vec<WireMessage>,
    /// Tokens to generate at most (default: the server's `--max-tokens`).
    pub max_completion_tokens: Option<usize>,
    /// The older name of `max_completion_tokens`.
    pub max_tokens: Option<usize>,
    /// Report each token's log-probability.
    pub logprobs: Option<bool>,
    /// With `logprobs`, this many likely alternatives per token (0..=20).
    pub top_logprobs: Option<usize>,
    #[serde(flatten)]
    pub sampler: SamplerFields,
}

const FIELDS: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "max_tokens",
    "logprobs",
    "top_logprobs",
    // Bookkeeping for the caller: no effect on the text.
    "metadata",
    "store",
    "service_tier",
    // Meaningless without `tools`, which are refused.
    "parallel_tool_calls",
];

const REFUSED: &[Refusal] = &[
    Refusal::new(
        "tools",
        "`tools` is not supported: this model cannot call functions",
    ),
    Refusal::new(
        "functions",
        "`functions` is not supported: this model cannot call functions",
    ),
    Refusal {
        field: "tool_choice",
        why: "`tool_choice` is not supported: this model cannot call functions",
        allowed: |v| v == "none",
    },
    Refusal {
        field: "function_call",
        why: "`function_call` is not supported: this model cannot call functions",
        allowed: |v| v == "none",
    },
    Refusal {
        field: "response_format",
        why: "`response_format` is not supported: only plain text (`{\"type\": \"text\"}`)",
        allowed: |v| v["type"] == "text",
    },
    Refusal {
        field: "modalities",
        why: "`modalities` is not supported: only `[\"text\"]`",
        allowed: |v| *v == json!(["text"]),
    },
    Refusal::new("audio", "`audio` is not supported: this model writes text"),
    Refusal::new(
        "prediction",
        "`prediction` is not supported: tinygpt has no speculative decoding",
    ),
    Refusal::new(
        "reasoning_effort",
        "`reasoning_effort` is not supported: this is not a reasoning model",
    ),
    Refusal::new(
        "web_search_options",
        "`web_search_options` is not supported: this model cannot search",
    ),
];

/// The most alternatives `top_logprobs` may ask for (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

/// A message as clients send it: `content` a string, a list of text parts, or null.
#[derive(Debug, Deserialize)]
pub(crate) struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    /// Accepted and ignored (OpenAI's participant name).
    #[serde(default, rename = "name")]
    pub _name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "a message's `content` must be a string or an array of text parts"
)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

pub(super) async fn chat(
    Extract(state): Extract<Shared>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let raw = body(raw, state.options.max_body_bytes)?;
    let request: ChatRequest = parse_checked(&raw, &[FIELDS, SAMPLER_FIELDS], REFUSED)?;
    let include_usage = request.sampler.include_usage()?;
    let top_logprobs = top_logprobs(&request)?;
    let n = request.sampler.n()?;
    let max_tokens = max_tokens(&state, &request)?;
    let template = &state.options.chat_template;
    let options = request
        .sampler
        .options(&state, max_tokens, template.stop(), top_logprobs)?;
    let text = template
        .render(&messages(request.messages)?)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template refused: {e}")))?;
    let prompt = encode(state.tokenizer(), &text, "messages")?;
    state.check_prompt(&prompt, "messages")?;
    let head = Head {
        id: state.completion_id("chatcmpl"),
        created: now(),
        model: state.name.clone(),
        prompt_tokens: prompt.len(),
    };
    let (events, receiver) = mpsc::channel(EVENTS_IN_FLIGHT);
    let generation = Generation {
        choices: choices(vec![prompt], n, options.seed),
        options,
        echo: false,
        logprobs: request.logprobs == Some(true),
    };
    submit(&state, Job::Complete { generation, events })?;
    let framing = Chat {
        head,
        logprobs: request.logprobs == Some(true),
        include_usage,
        completion_tokens: 0,
        started: vec![false; n],
    };
    if request.sampler.stream() {
        return Ok(sse(receiver, framing));
    }
    let done = collect(receiver, n).await?;
    Ok(framing.whole(done))
}

fn top_logprobs(request: &ChatRequest) -> Result<usize, ApiError> {
    match request.top_logprobs {
        Some(_) if request.logprobs != Some(true) => Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::invalid(
            "top_logprobs",
            format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, not {n}"),
        )),
        other => Ok(other.unwrap_or(0)),
    }
}

/// `max_completion_tokens` (or `max_tokens`), by default the server's `--max-tokens`.
fn max_tokens(state: &State, request: &ChatRequest) -> Result<usize, ApiError> {
    let limit = state.options.max_tokens;
    let (param, asked) = match (request.max_completion_tokens, request.max_tokens) {
        (Some(n), _) => ("max_completion_tokens", n),
        (None, Some(n)) => ("max_tokens", n),
        (None, None) => return Ok(limit),
    };
    match asked {
        1.. if asked <= limit => Ok(asked),
        _ => Err(ApiError::invalid(
            param,
            format!(
                "`{param}` must be between 1 and {limit} (this server's --max-tokens), not \
                 {asked}"
            ),
        )),
    }
}

/// The messages, their roles and text checked.
fn messages(wire: Vec<WireMessage>) -> Result<Vec<Message>, ApiError> {
    if wire.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    wire.into_iter()
        .map(|m| {
            if !ROLES.contains(&m.role.as_str()) {
                return Err(ApiError::invalid(
                    "messages",
                    format!("unknown role {:?}: use one of {}", m.role, ROLES.join(", ")),
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(text)) => text,
                Some(Content::Parts(parts)) => text_parts(parts)?,
            };
            Ok(Message {
                role: m.role,
                content,
            })
        })
        .collect()
}

fn text_parts(parts: Vec<Part>) -> Result<String, ApiError> {
    parts
        .into_iter()
        .map(|p| match (p.kind.as_str(), p.text) {
            ("text", Some(text)) => Ok(text),
            (kind, _) => Err(ApiError::invalid(
                "messages",
                format!("content parts of type {kind:?} are not supported: only text"),
            )),
        })
        .collect()
}

/// Chat's shapes: `chat.completion`, or `chat.completion.chunk`s with a `delta` (the role
/// first, then the content, then an empty delta with the `finish_reason`).
struct Chat {
    head: Head,
    logprobs: bool,
    include_usage: bool,
    completion_tokens: usize,
    /// Per choice: whether its first chunk (with the role) went out.
    started: Vec<bool>,
}

impl Chat {
    fn whole(self, done: Vec<Finished>) -> Response {
        let completion_tokens = done.iter().map(|d| d.completion_tokens).sum();
        let choices = done
            .into_iter()
            .enumerate()
            .map(|(index, d)| {
                json!({
                    "index": index,
                    "message": {"role": "assistant", "content": d.text},
                    "logprobs": self.logprobs.then(|| logprobs_object(&d.tokens)),
                    "finish_reason": d.reason,
                })
            })
            .collect();
        let usage = Usage::new(self.head.prompt_tokens, completion_tokens);
        json(
            StatusCode::OK,
            &self.head.object("chat.completion", choices, Some(usage)),
        )
    }

    fn chunk(&self, choice: Value) -> Vec<u8> {
        frame(
            &self
                .head
                .object("chat.completion.chunk", vec![choice], None),
        )
    }
}

impl Framing for Chat {
    fn piece(&mut self, index: usize, text: String, tokens: Vec<TokenLogprob>) -> Vec<u8> {
        let mut delta = json!({"content": text});
        if !std::mem::replace(&mut self.started[index], true) {
            delta["role"] = json!("assistant");
        }
        let logprobs = self.logprobs.then(|| logprobs_object(&tokens));
        self.chunk(
            json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": null}),
        )
    }

    fn finished(
        &mut self,
        index: usize,
        completion_tokens: usize,
        reason: &'static str,
    ) -> Vec<u8> {
        self.completion_tokens += completion_tokens;
        let mut out = Vec::new();
        if !std::mem::replace(&mut self.started[index], true) {
            // A reply with no text still says whose it is.
            let delta = json!({"role": "assistant", "content": ""});
            out = self.chunk(
                json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null}),
            );
        }
        out.extend(self.chunk(
            json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason}),
        ));
        out
    }

    fn end(&mut self) -> Vec<u8> {
        match self.include_usage {
            true => {
                let usage = Usage::new(self.head.prompt_tokens, self.completion_tokens);
                frame(
                    &self
                        .head
                        .object("chat.completion.chunk", Vec::new(), Some(usage)),
                )
            }
            false => Vec::new(),
        }
    }
}

/// OpenAI's chat `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs: [...]}]}`.
fn logprobs_object(tokens: &[TokenLogprob]) -> Value {
    let entry = |text: &str, logprob: f32| json!({"token": text, "logprob": logprob, "bytes": text.as_bytes()});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut value = entry(&t.text, t.logprob.unwrap_or(0.0));
            value["top_logprobs"] = t.top.iter().map(|(text, lp)| entry(text, *lp)).collect();
            value
        })
        .collect();
    json!({"content": content})
}
