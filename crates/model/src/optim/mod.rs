//! # optim: what every optimizer shares
//!
//! [`ParamLayout`]: the present parameters of a model end to end, in the parameter table's
//! order, the one flat layout the fused CPU step, the device AdamW kernel and the checkpoints'
//! optimizer state all use; the optimizers' settings and their per-parameter state as Burn's
//! records keep it (`state.rs`); and gradient clipping's factor (`clip.rs`), on the host and on
//! the device.
//!
//! May import [`crate::arch`] only; a built model's layout is read by
//! [`ParamLayout::of`] in [`crate::nn`].

mod clip;
mod layout;
mod state;

pub use clip::{clip_factor, clip_factor_on_device};
pub use layout::{LayoutEntry, LayoutError, ParamLayout};
pub use state::{
    AdamWSettings, LrRatios, MomentState, MuonSettings, NEWTON_SCHULZ, NEWTON_SCHULZ_EPSILON,
    NEWTON_SCHULZ_STEPS, VelocityState,
};
