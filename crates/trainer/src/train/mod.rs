//! Training, from a config to checkpoints:
//!
//! ```text
//! setup.rs         resolves once, in one direction: config (new, resumed or fine-tuned), then
//!                  tokenizer and data, the memory check, weights and optimizer, the engine, and
//!                  last the run directory
//! session.rs       the run as named steps (step, settle, evaluate, checkpoint) and nanoGPT's
//!                  loop over them
//! report.rs        clocks, log lines and the summary
//! snapshot.rs      what each evaluation keeps for watching: a sample, attention maps
//! engine/          the Engine trait, which owns the weights and the optimizer's state: Burn's
//!                  autodiff on the host or on a device, or the fused CPU engine, one file each
//! device_adamw.rs  AdamW on a GPU, gated on the device by the non-finite guard
//! loss_scale.rs    f16's dynamic loss scale, on the device
//! optim.rs         the Optimizer part (its update rule: AdamW, or Muon beside it, and the
//!                  groups), the learning-rate schedule, Burn's optimizer record
//! muon.rs          Muon as one of Burn's per-parameter optimizers (its settings and state)
//! state_pack.rs    the optimizer's state as `optimizer.bpk`, written a tensor at a time
//! memory.rs        the memory a run needs, checked before it allocates
//! ranks.rs         a run over ranks: what rank 0 hands the others, its word before each step,
//!                  the checks that every rank holds what rank 0 holds
//! follower.rs      a rank other than 0: the steps rank 0 orders, nothing written
//! ```

pub mod device_adamw;
pub mod engine;
mod follower;
pub mod loss_scale;
pub mod memory;
pub mod muon;
pub mod optim;
mod ranks;
mod report;
pub mod session;
mod setup;
mod snapshot;
pub mod state_pack;
mod to_loss;

pub use engine::{Engine, Saving, Step};
pub use follower::follow;
pub use session::{Limits, Outcome, Trainer, train_step};
pub use setup::TrainOptions;
