//! The request fields completions and chat share, and how a request body is checked: every
//! field of OpenAI's request is known (used, or refused with a 400 that names it); a field that
//! is not OpenAI's (nor one of tinygpt's extensions) is refused, so a client never believes a
//! setting took effect when tinygpt does not have it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use tinygpt_model::{GenerateError, GenerateOptions};

use super::api::{ApiError, Stop, StreamOptions, parse};
use super::state::{State, encode};

/// The sampler's fields, the same in `/v1/completions` and `/v1/chat/completions`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SamplerFields {
    /// OpenAI's default: 1.
    pub temperature: Option<f32>,
    /// OpenAI's default: 1.
    pub top_p: Option<f32>,
    /// Choices to generate (default 1); choice `i` samples with `seed + i`.
    pub n: Option<usize>,
    pub stop: Option<Stop>,
    /// Absent: a random seed, as OpenAI does.
    pub seed: Option<u64>,
    /// -2..=2 (OpenAI's definition: on the counts of the tokens generated so far).
    pub frequency_penalty: Option<f32>,
    /// -2..=2.
    pub presence_penalty: Option<f32>,
    /// Token id (as a string, OpenAI's shape) → bias in -100..=100.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Accepted and ignored: the server serves one model (llama.cpp's convention).
    #[serde(rename = "model")]
    pub _model: Option<String>,
    /// Accepted and ignored.
    #[serde(rename = "user")]
    pub _user: Option<String>,
    /// tinygpt: sample among the k most likely tokens only.
    pub top_k: Option<usize>,
    /// vLLM's and llama.cpp's: only tokens at least this likely relative to the most likely
    /// (0 = off).
    pub min_p: Option<f32>,
    /// tinygpt: penalise tokens already in the context (1 = off).
    pub repetition_penalty: Option<f32>,
    /// tinygpt: past block_size, refill the cache from the last half block (faster, not
    /// nanoGPT's exact rule). Absent: the server's `--context-shift` setting.
    pub context_shift: Option<bool>,
}

/// The keys of [`SamplerFields`].
pub(crate) const SAMPLER_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "stream",
    "stream_options",
    "model",
    "user",
    "top_k",
    "min_p",
    "repetition_penalty",
    "context_shift",
];

/// The most choices one request may ask for (`n` times the prompts).
pub(crate) const MAX_CHOICES: usize = 16;

impl SamplerFields {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// `n`, checked.
    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n.unwrap_or(1) {
            n @ 1..=MAX_CHOICES => Ok(n),
            n => Err(ApiError::invalid(
                "n",
                format!("`n` must be between 1 and {MAX_CHOICES}, not {n}"),
            )),
        }
    }

    /// Whether to send a last chunk with `usage`; `stream_options` without `stream` is refused.
    pub fn include_usage(&self) -> Result<bool, ApiError> {
        if self.stream_options.is_some() && !self.stream() {
            return Err(ApiError::invalid(
                "stream_options",
                "`stream_options` is only allowed with `stream: true`",
            ));
        }
        Ok(self
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage))
    }

    /// The sampler's settings: `max_tokens` new tokens at most, `stop` besides the request's
    /// own (a chat template's), `top_logprobs` alternatives per token. The error names the
    /// field.
    pub fn options(
        &self,
        state: &State,
        max_tokens: usize,
        extra_stop: &[String],
        top_logprobs: usize,
    ) -> Result<GenerateOptions, ApiError> {
        let stop = self.stop.as_ref().map(Stop::to_vec).unwrap_or_default();
        if stop.len() > 4 {
            return Err(ApiError::invalid("stop", "at most 4 stop sequences"));
        }
        let stop = stop
            .iter()
            .chain(extra_stop)
            .map(|s| match s.is_empty() {
                true => Err(ApiError::invalid("stop", "a stop sequence is empty")),
                false => encode(state.tokenizer(), s, "stop"),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let options = GenerateOptions {
            max_new_tokens: max_tokens,
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.filter(|&k| k > 0),
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            logit_bias: self.logit_bias(state.tokenizer().vocab_size())?,
            top_logprobs,
            seed: self.seed.unwrap_or_else(rand::random),
            stop,
            use_cache: true,
            context_shift: self.context_shift.unwrap_or(state.options.context_shift),
        };
        options.validate().map_err(|e| {
            let param = match e {
                GenerateError::Temperature(_) => Some("temperature"),
                GenerateError::TopP(_) => Some("top_p"),
                GenerateError::MinP(_) => Some("min_p"),
                GenerateError::TopK => Some("top_k"),
                GenerateError::RepetitionPenalty(_) => Some("repetition_penalty"),
                GenerateError::FrequencyPenalty(_) => Some("frequency_penalty"),
                GenerateError::PresencePenalty(_) => Some("presence_penalty"),
                GenerateError::LogitBias { .. } => Some("logit_bias"),
                GenerateError::EmptyStop => Some("stop"),
                // Not about an option: no field to name.
                GenerateError::EmptyPrompt
                | GenerateError::NonFiniteLogits { .. }
                | GenerateError::Model(_) => None,
            };
            match param {
                Some(param) => ApiError::invalid(param, e.to_string()),
                None => ApiError::new(axum::http::StatusCode::BAD_REQUEST, e.to_string()),
            }
        })?;
        Ok(options)
    }

    /// `logit_bias`'s keys as token ids inside the vocabulary.
    fn logit_bias(&self, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(bias) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        bias.iter()
            .map(|(key, &value)| match key.trim().parse::<u32>() {
                Ok(id) if (id as usize) < vocab => Ok((id, value)),
                _ => Err(ApiError::invalid(
                    "logit_bias",
                    format!(
                        "`logit_bias` keys are token ids from 0 to {}, not {key:?}",
                        vocab - 1
                    ),
                )),
            })
            .collect()
    }
}

/// `body` parsed as `T` once its keys are checked: a key of `refused` whose value is not null
/// (nor an `allowed` value of it) is a 400 naming it and why; any key in neither list is an
/// unknown field.
pub(crate) fn parse_checked<T: DeserializeOwned>(
    body: &[u8],
    known: &[&[&str]],
    refused: &[Refusal],
) -> Result<T, ApiError> {
    let value: serde_json::Value = parse(body)?;
    let Some(object) = value.as_object() else {
        return Err(ApiError::invalid(
            "body",
            "the request body must be a JSON object",
        ));
    };
    for (key, field) in object {
        if let Some(refusal) = refused.iter().find(|r| r.field == key) {
            if !field.is_null() && !(refusal.allowed)(field) {
                return Err(ApiError::invalid(refusal.field, refusal.why));
            }
            continue;
        }
        if !known.iter().any(|fields| fields.contains(&key.as_str())) {
            return Err(ApiError::new(
                axum::http::StatusCode::BAD_REQUEST,
                format!("unknown field `{key}`: tinygpt does not have this setting"),
            ));
        }
    }
    let mut object = object.clone();
    object.retain(|key, _| !refused.iter().any(|r| r.field == key));
    serde_json::from_value(serde_json::Value::Object(object)).map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::BAD_REQUEST,
            format!("the request body is not valid: {e}"),
        )
    })
}

/// An OpenAI field tinygpt cannot honour, and why; `allowed` lets values through that ask for
/// nothing (e.g. `tool_choice: "none"`).
pub(crate) struct Refusal {
    pub field: &'static str,
    pub why: &'static str,
    pub allowed: fn(&serde_json::Value) -> bool,
}

impl Refusal {
    pub const fn new(field: &'static str, why: &'static str) -> Self {
        Self {
            field,
            why,
            allowed: |_| false,
        }
    }
}
