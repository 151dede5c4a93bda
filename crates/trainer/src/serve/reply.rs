//! Answering a generation, whole or streamed, for completions and chat alike: the events of a
//! job gathered per choice, or framed one by one as server-sent events.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::api::{ApiError, Usage};
use super::generation::{Event, TokenLogprob};

/// Pieces of text a generation may run ahead of its client.
pub(crate) const EVENTS_IN_FLIGHT: usize = 64;

/// What every response of one request shares.
pub struct Head {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: usize,
}

impl Head {
    /// A response object: `object` with `choices` and, if given, `usage`.
    pub fn object(&self, object: &str, choices: Vec<Value>, usage: Option<Usage>) -> Value {
        let mut value = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(usage) = usage {
            value["usage"] = json!(usage);
        }
        value
    }
}

/// One choice, generated to its end.
#[derive(Debug, Default)]
pub struct Finished {
    pub text: String,
    pub tokens: Vec<TokenLogprob>,
    pub completion_tokens: usize,
    pub reason: &'static str,
}

/// Waits for every one of `choices` to finish. If the client goes away meanwhile, this future
/// is dropped with the receiver, which cancels the generation.
pub async fn collect(
    mut events: mpsc::Receiver<Event>,
    choices: usize,
) -> Result<Vec<Finished>, ApiError> {
    let mut done: Vec<Finished> = (0..choices).map(|_| Finished::default()).collect();
    let mut finished = 0;
    while let Some(event) = events.recv().await {
        match event {
            Event::Piece {
                index,
                text,
                tokens,
            } => {
                done[index].text.push_str(&text);
                done[index].tokens.extend(tokens);
            }
            Event::Finished {
                index,
                completion_tokens,
                reason,
            } => {
                done[index].completion_tokens = completion_tokens;
                done[index].reason = reason;
                finished += 1;
            }
            Event::Failed(message) => {
                return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message));
            }
        }
    }
    match finished == choices {
        true => Ok(done),
        false => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the generation ended without a result",
        )),
    }
}

/// How one kind of response writes its stream's chunks.
pub(crate) trait Framing: Send + 'static {
    /// Text of choice `index` (with its tokens' log-probabilities when asked).
    fn piece(&mut self, index: usize, text: String, tokens: Vec<TokenLogprob>) -> Vec<u8>;
    /// Choice `index` is done.
    fn finished(&mut self, index: usize, completion_tokens: usize, reason: &'static str)
    -> Vec<u8>;
    /// After the last choice, before `[DONE]` (the usage chunk, when asked).
    fn end(&mut self) -> Vec<u8>;
}

/// Server-sent events: a `data: {chunk}` per event as `framing` writes it, then `data: [DONE]`.
/// When the client goes away, hyper drops this stream and with it the receiver, which cancels
/// the generation.
pub(crate) fn sse(events: mpsc::Receiver<Event>, framing: impl Framing) -> Response {
    let stream = futures_util::stream::unfold(Some((events, framing)), |state| async move {
        let (mut events, mut framing) = state?;
        let (bytes, more) = match events.recv().await {
            Some(Event::Piece {
                index,
                text,
                tokens,
            }) => (framing.piece(index, text, tokens), true),
            Some(Event::Finished {
                index,
                completion_tokens,
                reason,
            }) => (framing.finished(index, completion_tokens, reason), true),
            Some(Event::Failed(message)) => {
                let error = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message);
                let mut out = frame(&error.body());
                out.extend_from_slice(b"data: [DONE]\n\n");
                (out, false)
            }
            None => {
                let mut out = framing.end();
                out.extend_from_slice(b"data: [DONE]\n\n");
                (out, false)
            }
        };
        let next = more.then_some((events, framing));
        Some((Ok::<_, Infallible>(Bytes::from(bytes)), next))
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
pub fn frame(value: &impl serde::Serialize) -> Vec<u8> {
    let json = serde_json::to_string(value).expect("API types serialise");
    format!("data: {json}\n\n").into_bytes()
}
