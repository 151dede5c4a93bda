//! Typed errors: bad configs and bad inputs are values, never panics.

use thiserror::Error;

/// A [`CausalSelfAttentionConfig`](crate::CausalSelfAttentionConfig) value that cannot work.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AttentionConfigError {
    #[error("attention `{name}` must be at least 1, got 0")]
    Zero { name: &'static str },
    #[error("attention `n_heads` ({n_heads}) must divide `d_model` ({d_model})")]
    HeadsDoNotDivide { d_model: usize, n_heads: usize },
    #[error("attention `dropout` must be in [0, 1), got {0}")]
    Dropout(f64),
    #[error("attention `{name}` must be a finite number >= 0, got {value}")]
    InitStd { name: &'static str, value: f64 },
    #[error("rotary positions need an even, non-zero head size, got d_head = {d_head}")]
    RopeOddHead { d_head: usize },
    #[error("rotary positions need a finite base > 0, got {0}")]
    RopeBase(f64),
    #[error(
        "attention `n_kv_heads` ({n_kv_heads}) must be at least 1 and divide `n_heads` ({n_heads})"
    )]
    KvHeadsDoNotDivide { n_heads: usize, n_kv_heads: usize },
    #[error("QK-norm's ε must be a finite number > 0, got {0}")]
    QkNormEps(f64),
}

/// An input the layer cannot attend over.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttentionError {
    #[error("sequence of {len} tokens is longer than the context of {max} tokens")]
    SequenceTooLong { len: usize, max: usize },
    #[error("input has {got} channels, the layer expects d_model = {expected}")]
    WidthMismatch { expected: usize, got: usize },
    #[error("input sequence is empty")]
    EmptySequence,
    #[error("a training pass needs a device that tracks gradients (an autodiff device)")]
    TrainWithoutGradients,
    #[error("padding mask has shape {got:?}, expected [batch, seq] = {expected:?}")]
    PaddingMaskShape {
        expected: [usize; 2],
        got: [usize; 2],
    },
    #[error("key/value cache holds batch {cached}, input has batch {got}")]
    CacheBatchMismatch { cached: usize, got: usize },
    #[error("a batch of {rows} rows needs one cache of one sequence per row, got {caches}")]
    RowCaches { rows: usize, caches: usize },
    #[error("each row of a batched step feeds {step} token(s), got {got}")]
    RowTokens { got: usize, step: usize },
    #[error("a decode step writes a fixed cache of {expected} rows, got {capacity:?}")]
    StepCache {
        capacity: Option<usize>,
        expected: usize,
    },
    #[error("the decode step's tables were made without the layer's rotary positions")]
    StepRope,
}
