//! What the optimizers are told and what they keep, as Burn's optimizers and records hold it:
//! AdamW's and Muon's settings, and each parameter's state in the per-parameter form Burn's
//! record keeps (the engines hold it flat, in a [`ParamLayout`](super::ParamLayout)'s order).

use burn::module::ParamId;

use crate::arch::Slot;

/// AdamW's settings, as Burn's `AdamWConfig` takes them, which parameters decay, and each
/// group's learning rate.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamWSettings {
    pub beta_1: f32,
    pub beta_2: f32,
    pub epsilon: f32,
    pub weight_decay: f32,
    /// The parameters weight decay applies to (nanoGPT: the matrices); the others get none.
    pub decayed: Vec<ParamId>,
    /// Each group's learning rate over the schedule's.
    pub lr_ratios: LrRatios,
}

/// The learning rate of each group of parameters over the schedule's: the embeddings' (the
/// token, position and bigram tables) and the untied head's, nanochat's groups (its embeddings
/// learn far faster than its matrices, its head slower); every other parameter at the
/// schedule's. The trainer's `[train]` `embedding_lr_ratio` and `head_lr_ratio`, 1 each by
/// default: the same step, bit for bit, as without groups.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrRatios {
    pub embedding: f64,
    pub head: f64,
}

impl Default for LrRatios {
    fn default() -> Self {
        Self {
            embedding: 1.0,
            head: 1.0,
        }
    }
}

impl LrRatios {
    /// The ratio of the parameter in `slot` (a tied head is the token embedding: its ratio).
    pub fn of(&self, slot: Slot) -> f64 {
        match slot {
            Slot::TokenEmbedding | Slot::PositionEmbedding | Slot::BigramEmbedding => {
                self.embedding
            }
            Slot::LmHead => self.head,
            Slot::Block(..) | Slot::FinalNormGain | Slot::FinalNormBias | Slot::Adapter { .. } => {
                1.0
            }
        }
    }
}

/// One parameter's AdamW state, as Burn keeps it: steps taken and the two moments (flat).
#[derive(Debug, Clone, PartialEq)]
pub struct MomentState {
    pub id: ParamId,
    pub shape: Vec<usize>,
    pub time: usize,
    pub moment_1: Vec<f32>,
    pub moment_2: Vec<f32>,
}

/// Muon's settings: its learning rate relative to the schedule's, its momentum warm-up and
/// weight decay. The trainer's `[train]` `muon_*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MuonSettings {
    /// Muon's learning rate over the schedule's (`muon_learning_rate / learning_rate`): the
    /// schedule moves both groups together.
    pub lr_ratio: f64,
    pub momentum: f64,
    pub momentum_start: f64,
    /// Steps over which the momentum goes from `momentum_start` to `momentum`; 0 = none.
    pub warmup: usize,
    /// Decoupled weight decay, `w ← w·(1 − lr·decay)` at Muon's learning rate.
    pub weight_decay: f64,
}

impl MuonSettings {
    /// The momentum of the update after `step` earlier ones: linear warm-up, then constant.
    pub fn momentum_at(&self, step: u64) -> f64 {
        let done = match self.warmup {
            0 => 1.0,
            w => (step as f64 / w as f64).min(1.0),
        };
        self.momentum_start + done * (self.momentum - self.momentum_start)
    }
}

/// Newton–Schulz's coefficients, steps and normalisation floor (Burn's and Keller Jordan's).
pub const NEWTON_SCHULZ: (f32, f32, f32) = (3.4445, -4.775, 2.0315);
pub const NEWTON_SCHULZ_STEPS: usize = 5;
pub const NEWTON_SCHULZ_EPSILON: f32 = 1e-7;

/// One matrix's Muon state, as Burn's optimizer record keeps it: the momentum buffer (flat, in
/// the parameter's shape) and the updates taken.
#[derive(Debug, Clone, PartialEq)]
pub struct VelocityState {
    pub id: ParamId,
    pub shape: Vec<usize>,
    pub step: u64,
    pub velocity: Vec<f32>,
}
