//! AdamW's state lent out of [`FusedCpu`] to be serialised one parameter at a time, instead of
//! copied whole: a checkpoint of a model of N parameters then needs no 2·N floats besides the
//! moments themselves.

use std::sync::Arc;

use burn::module::ParamId;

use super::adamw::Moments;

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
    pub(crate) slot: crate::arch::Slot,
}

impl LentMoments {
    /// `moments`' entries `entries` (each with its slot), shared.
    pub(crate) fn new(moments: Arc<Moments>, entries: Vec<LentEntry>) -> Self {
        Self {
            moments,
            entries: entries.into(),
        }
    }

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
