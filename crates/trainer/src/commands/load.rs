//! What the commands that read a run's weights start from.

use std::path::Path;

use anyhow::Result;
use tinygpt::backend::{Backend, EngineKind, Placement};
use tinygpt::decoder::{DecodeWeights, Weights, sampling_engine};
use tinygpt::run::checkpoint::{Run, TrainState, Which};
use tinygpt_model::{Gpt, Matrices};

/// The run in `checkpoint`, where `backend` places it, and the `which` weights on that device:
/// what the commands that read a run's weights start from.
pub(super) fn load(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
) -> Result<(Run, Placement, Gpt, TrainState)> {
    let run = Run::open(checkpoint)?;
    let placement = backend.placement()?;
    if let Some(note) = &placement.note {
        eprintln!("note: {note}");
    }
    let (model, state) = run.load_model(which, &placement.device)?;
    let model = placement.model(model);
    Ok((run, placement, model, state))
}

/// What `generate` and `serve` sample from ([`for_sampling`]) and `eval` and `logits` score
/// with ([`for_scoring`]).
pub(super) struct Sampling {
    pub run: Run,
    pub placement: Placement,
    pub model: Gpt,
    pub weights: DecodeWeights,
    /// The fused decoder's matrices, where it samples.
    pub matrices: Option<Matrices>,
    pub state: TrainState,
}

/// [`load`], for sampling with `weights`: where the fused decoder samples with `--weights
/// file`, the matrices it takes from the run's kept blocks are never read from the checkpoint
/// (nor, for a tied model, the embedding, looked up in the head's blocks), so that a four-bit
/// file's model is held in its blocks, not in f32 beside them.
pub(super) fn for_sampling(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
    weights: Weights,
) -> Result<Sampling> {
    let run = Run::open(checkpoint)?;
    let placement = backend.placement()?;
    if let Some(note) = &placement.note {
        eprintln!("note: {note}");
    }
    let (weights, note) = DecodeWeights::for_run(weights, &run.dir)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    let matrices = match sampling_engine(&placement)? {
        EngineKind::Fused => Some(weights.matrices(EngineKind::Fused)?),
        EngineKind::Autodiff | EngineKind::Device => None,
    };
    let config = run.config.gpt(run.tokenizer.vocab_size());
    let unread = matrices.as_ref().map(|m| m.unread_parameters(&config));
    let unread = unread.unwrap_or_default();
    let (model, state) = run.load_model_without(which, &placement.device, &unread)?;
    let model = placement.model(model);
    Ok(Sampling {
        run,
        placement,
        model,
        weights,
        matrices,
        state,
    })
}

/// What `eval` and `logits` score with `weights`: with `file`, the run loaded as
/// [`for_sampling`] loads it (the matrices its kept blocks give never read in f32); otherwise as
/// [`load`] loads it, no matrices made yet.
pub(super) fn for_scoring(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
    weights: Weights,
) -> Result<Sampling> {
    if weights == Weights::File {
        return for_sampling(checkpoint, which, backend, weights);
    }
    let (run, placement, model, state) = load(checkpoint, which, backend)?;
    Ok(Sampling {
        run,
        placement,
        model,
        weights: weights.into(),
        matrices: None,
        state,
    })
}
