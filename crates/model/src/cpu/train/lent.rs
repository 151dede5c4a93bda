//! AdamW's state lent out of [`FusedCpu`] to be serialised one parameter at a time, instead of
//! copied whole: a checkpoint of a model of N parameters then needs no 2·N floats besides the
//! moments themselves.

use std::sync::Arc;

use burn::module::ParamId;

use super::adamw::Moments;
use super::fused::FusedCpu;

/// AdamW's moments of every parameter it updates, shared with the engine until dropped
/// (clones share them too: a serialiser's readers).
#[derive(Debug, Clone)]
pub struct LentMoments {
    moments: Arc<Moments>,
    entries: Arc<[LentEntry]>,
}

/// One parameter of [`LentMoments`]: what [`MomentState`](crate::MomentState) says of it
/// besides its values.
#[derive(Debug, Clone, PartialEq)]
pub struct LentEntry {
    pub id: ParamId,
    pub shape: Vec<usize>,
    /// Steps taken.
    pub time: usize,
    slot: crate::arch::Slot,
}

impl LentMoments {
    /// The parameters, in the layout's order (as [`FusedCpu::adamw_state`] lists them).
    pub fn entries(&self) -> &[LentEntry] {
        &self.entries
    }

    /// Entry `i`'s first moment.
    pub fn moment_1(&self, i: usize) -> &[f32] {
        self.moments.m.slot(self.entries[i].slot)
    }

    /// Entry `i`'s second moment.
    pub fn moment_2(&self, i: usize) -> &[f32] {
        self.moments.v.slot(self.entries[i].slot)
    }
}

impl FusedCpu {
    /// AdamW's state (as [`adamw_state`](Self::adamw_state) lists it), shared rather than
    /// copied; `None` before the first step. Drop it before the next step, which panics
    /// while it is alive.
    pub fn lend_adamw_state(&self) -> Option<LentMoments> {
        let moments = self.moments.as_ref()?;
        let muon = |i: usize| self.muon.as_ref().is_some_and(|m| m.updates(i));
        let entries = self.weights.layout().entries();
        let lent = entries
            .iter()
            .zip(&moments.time)
            .enumerate()
            .filter(|(i, _)| !muon(*i))
            .map(|(_, (entry, &time))| LentEntry {
                id: entry.id,
                shape: entry.shape.clone(),
                time,
                slot: entry.slot,
            })
            .collect();
        Some(LentMoments {
            moments: Arc::clone(moments),
            entries: lent,
        })
    }
}
