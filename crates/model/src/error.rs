//! Typed errors of the model crate.

use thiserror::Error;
use tinygpt_attention::{AttentionConfigError, AttentionError};

/// A [`GptConfig`](crate::GptConfig) value that cannot work; the message names the key.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GptConfigError {
    #[error("`{name}` must be at least 1, got 0")]
    Zero { name: &'static str },
    #[error("`n_head` ({n_head}) must divide `n_embd` ({n_embd})")]
    HeadsDoNotDivide { n_embd: usize, n_head: usize },
    #[error("`dropout` must be in [0, 1), got {0}")]
    Dropout(f64),
    #[error("`layer_norm_eps` must be a finite number > 0, got {0}")]
    LayerNormEps(f64),
    #[error("`logit_softcap` must be a finite number >= 0 (0 = none), got {0}")]
    LogitSoftcap(f64),
    #[error("`n_kv_head` ({n_kv_head}) must be at least 1 and divide `n_head` ({n_head})")]
    KvHeadsDoNotDivide { n_head: usize, n_kv_head: usize },
    #[error("`rope_theta` must be a finite number > 0, got {0}")]
    RopeTheta(f64),
    #[error("`vocab_size` = {rows} is smaller than the tokenizer's vocabulary ({tokens})")]
    VocabularyTooSmall { rows: usize, tokens: usize },
    #[error(
        "`bigram` makes a row per pair of tokens, for vocabularies of at most 1024 tokens (a \
         character tokenizer); this one has {vocab}"
    )]
    BigramVocabulary { vocab: usize },
    #[error("[lora]: {0}")]
    Lora(String),
    #[error(transparent)]
    Attention(#[from] AttentionConfigError),
}

/// An input the model cannot process.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    #[error("token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: i64, vocab_size: usize },
    #[error(transparent)]
    Attention(#[from] AttentionError),
    #[error("the model's weights do not fit its config: {0}")]
    ConfigMismatch(String),
    #[error(
        "a model with a bigram table embeds each token with the one before it: this feed gave \
         the tokens without their pairs"
    )]
    BigramPairs,
}

/// The loss has nothing to average.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LossError {
    #[error("every target is ignore_index ({ignore_index}): the loss has nothing to average")]
    AllTargetsIgnored { ignore_index: i64 },
    #[error("logits have {logits} rows but there are {targets} targets")]
    ShapeMismatch { logits: usize, targets: usize },
}

/// Invalid sampling options or prompt.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum GenerateError {
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    #[error("`temperature` must be >= 0 (0 = greedy), got {0}")]
    Temperature(f32),
    #[error("`top_p` must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("`min_p` must be in [0, 1] (0 = off), got {0}")]
    MinP(f32),
    #[error("`top_k` must be at least 1")]
    TopK,
    #[error("`repetition_penalty` must be > 0 (1 = off), got {0}")]
    RepetitionPenalty(f32),
    #[error("`frequency_penalty` must be between -2 and 2, got {0}")]
    FrequencyPenalty(f32),
    #[error("`presence_penalty` must be between -2 and 2, got {0}")]
    PresencePenalty(f32),
    #[error("`logit_bias` of token {id} must be between -100 and 100, got {bias}")]
    LogitBias { id: u32, bias: f32 },
    #[error("a stop sequence is empty")]
    EmptyStop,
    #[error(
        "the model's logits are not finite (NaN or infinite) at position {position}: its weights \
         are damaged or training diverged"
    )]
    NonFiniteLogits { position: usize },
    #[error(transparent)]
    Model(#[from] ModelError),
}
