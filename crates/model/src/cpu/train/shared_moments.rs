//! AdamW's state shared by [`FusedCpu`] with a serialiser that writes it one parameter at a
//! time, instead of copied whole: a checkpoint of a model of N parameters then needs no 2·N
//! floats besides the moments themselves. (Sharing, not lending: the engine keeps reading
//! them; only the weights are lent, see [`LentWeights`](super::LentWeights).)

use std::sync::Arc;

use burn::module::ParamId;

use super::adamw::Moments;

/// AdamW's moments of every parameter it updates, shared with the engine until dropped
/// (clones share them too: a serialiser's readers). A step while they are shared copies them
/// first ([`Arc::make_mut`]); the trainer's checkpoint borrows the engine for as long as its
/// writer lives, so none does.
#[derive(Debug, Clone)]
pub struct SharedMoments {
    moments: Arc<Moments>,
    entries: Arc<[MomentEntry]>,
}

/// One parameter of [`SharedMoments`]: what [`MomentState`](crate::MomentState) says of it
/// besides its values.
#[derive(Debug, Clone, PartialEq)]
pub struct MomentEntry {
    pub id: ParamId,
    pub shape: Vec<usize>,
    /// Steps taken.
    pub time: usize,
    pub(crate) slot: crate::arch::Slot,
}

impl SharedMoments {
    /// `moments`' entries `entries` (each with its slot), shared.
    pub(crate) fn new(moments: Arc<Moments>, entries: Vec<MomentEntry>) -> Self {
        Self {
            moments,
            entries: entries.into(),
        }
    }

    /// The parameters, in the layout's order (as [`FusedCpu::adamw_state`] lists them).
    pub fn entries(&self) -> &[MomentEntry] {
        &self.entries
    }

    /// Entry `i`'s first moment.
    pub fn moment_1(&self, i: usize) -> &[f32] {
        self.moments.m.slot(self.entries[i].slot).or_none()
    }

    /// Entry `i`'s second moment.
    pub fn moment_2(&self, i: usize) -> &[f32] {
        self.moments.v.slot(self.entries[i].slot).or_none()
    }
}
