//! What the commands that read a run's weights start from.

use std::path::Path;

use anyhow::Result;
use tinygpt::backend::{Backend, Placement};
use tinygpt::run::checkpoint::{Run, TrainState, Which};
use tinygpt_model::Gpt;

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
