//! The fused training step: [`FusedCpu`] (the facade the trainer holds, `fused.rs`; Muon's
//! methods in `fused_muon.rs`), each thread's share of a batch (`workspace.rs`), and the two
//! optimizers on the flat buffers (`adamw.rs`, `muon.rs`: Burn's arithmetic, bit for bit);
//! AdamW's state shared with a serialiser that writes it a parameter at a time
//! (`shared_moments.rs`); the weights lent to Burn's model for a checkpoint or a sample
//! (`lending.rs`), or decoded from in place for a LoRA run's samples (`sampling.rs`); a data-parallel run's gradients summed over its ranks while the backward
//! goes on (`overlap.rs`).

mod adamw;
mod fused;
mod fused_muon;
mod lending;
mod muon;
mod overlap;
mod sampling;
mod shared_moments;
mod workspace;

pub use fused::FusedCpu;
pub use lending::LentWeights;
pub use overlap::GradientSum;
pub use shared_moments::{MomentEntry, SharedMoments};
pub use workspace::TokenBatch;
