//! The fused training step: [`FusedCpu`] (the facade the trainer holds, `fused.rs`; Muon's
//! methods in `fused_muon.rs`), each thread's share of a batch (`workspace.rs`), and the two
//! optimizers on the flat buffers (`adamw.rs`, `muon.rs`: Burn's arithmetic, bit for bit);
//! AdamW's state lent out to be serialised a parameter at a time (`lent.rs`).

mod adamw;
mod fused;
mod fused_muon;
mod lent;
mod muon;
mod workspace;

pub use fused::FusedCpu;
pub use lent::{LentEntry, LentMoments};
pub use workspace::TokenBatch;
