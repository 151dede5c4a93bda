//! What the commands that read a run's weights start from.

use std::path::Path;

use anyhow::Result;
use tinygpt::backend::{Backend, EngineKind, Placement};
use tinygpt::decoder::{DecodeWeights, Weights, sampling_engine};
use tinygpt::interop::gguf::kept::FileTypes;
use tinygpt::run::checkpoint::{Run, TrainState, Which};
use tinygpt_model::{Gpt, Matrices};

/// The run in `checkpoint` and where `backend` places it (its note said).
fn open(checkpoint: &Path, backend: Backend) -> Result<(Run, Placement)> {
    let run = Run::open(checkpoint)?;
    let placement = backend.placement()?;
    if let Some(note) = &placement.note {
        eprintln!("note: {note}");
    }
    Ok((run, placement))
}

/// The run in `checkpoint`, where `backend` places it, and the `which` weights on that device:
/// what the commands that read a run's weights start from.
pub(super) fn load(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
) -> Result<(Run, Placement, Gpt, TrainState)> {
    let (run, placement) = open(checkpoint, backend)?;
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
    /// The weights `--weights` asked for, or its default ([`chosen`]).
    pub weights: DecodeWeights,
    /// The fused decoder's matrices, where it samples.
    pub matrices: Option<Matrices>,
    pub state: TrainState,
}

/// `--weights` where it is given; otherwise `file` for a run imported from a quantised GGUF
/// file (its matrices kept in the file's own blocks) where the fused CPU decoder runs, as
/// llama.cpp decodes the file (said in a note once its blocks are read: [`sampled`]); `f32`
/// for any other run or device. The second: whether it is that default.
fn chosen(asked: Option<Weights>, run: &Run, placement: &Placement) -> Result<(Weights, bool)> {
    if let Some(weights) = asked {
        return Ok((weights, false));
    }
    let kept = FileTypes::read(&run.dir)?.is_some_and(|types| types.kept().0 > 0);
    if kept && sampling_engine(placement)? == EngineKind::Fused {
        return Ok((Weights::File, true));
    }
    Ok((Weights::F32, false))
}

/// [`load`], for sampling with `weights` ([`chosen`]): where the fused decoder samples with
/// `--weights file`, the matrices it takes from the run's kept blocks are never read from the
/// checkpoint (nor the embedding, looked up in its own blocks or a tied head's), so that a
/// four-bit file's model is held in its blocks, not in f32 beside them.
pub(super) fn for_sampling(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
    weights: Option<Weights>,
) -> Result<Sampling> {
    let (run, placement) = open(checkpoint, backend)?;
    let weights = chosen(weights, &run, &placement)?;
    sampled(run, placement, which, weights)
}

/// [`for_sampling`] of an opened run, its weights chosen (and whether by default).
fn sampled(
    run: Run,
    placement: Placement,
    which: Which,
    (chosen, by_default): (Weights, bool),
) -> Result<Sampling> {
    let (weights, note) = DecodeWeights::for_run(chosen, &run.dir)?;
    let matrices = match sampling_engine(&placement)? {
        EngineKind::Fused => Some(weights.matrices(EngineKind::Fused)?),
        EngineKind::Autodiff | EngineKind::Device => None,
    };
    // Said once the blocks are read: a run whose blocks are damaged fails in one line.
    if by_default {
        eprintln!(
            "note: decoding each matrix in the blocks of the GGUF file the run was imported \
             from (--weights file); --weights f32 decodes their values in f32"
        );
    }
    if let Some(note) = note {
        eprintln!("{note}");
    }
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

/// What `eval` and `logits` score with `weights` ([`chosen`]): with `file`, the run loaded as
/// [`for_sampling`] loads it (the matrices its kept blocks give never read in f32); otherwise as
/// [`load`] loads it, no matrices made yet.
pub(super) fn for_scoring(
    checkpoint: &Path,
    which: Which,
    backend: Backend,
    weights: Option<Weights>,
) -> Result<Sampling> {
    let (run, placement) = open(checkpoint, backend)?;
    let (chosen, by_default) = chosen(weights, &run, &placement)?;
    if chosen == Weights::File {
        return sampled(run, placement, which, (chosen, by_default));
    }
    let (model, state) = run.load_model(which, &placement.device)?;
    let model = placement.model(model);
    Ok(Sampling {
        run,
        placement,
        model,
        weights: chosen.into(),
        matrices: None,
        state,
    })
}
