//! [`FusedError`]: what the fused CPU engine refuses.

use thiserror::Error;

use crate::error::{LossError, ModelError};

/// Why the fused CPU engine cannot run a batch or take an optimizer state.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FusedError {
    #[error("inputs and targets hold {inputs} and {targets} ids for a [{batch}, {seq}] batch")]
    BatchShape {
        inputs: usize,
        targets: usize,
        batch: usize,
        seq: usize,
    },
    #[error("the optimizer state does not fit this model: {0}")]
    OptimizerState(String),
    #[error("the matrices' storage does not fit the model: {0}")]
    Storage(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Loss(#[from] LossError),
}
