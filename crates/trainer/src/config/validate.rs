//! [`RunConfig::validate`]: every value serde cannot check, each error naming its key.

use anyhow::{Result, bail};

use super::{Batching, RunConfig};
use crate::data::tokenizer::TokenizerKind;

/// Where a number of the config may lie.
#[derive(Debug, Clone, Copy)]
enum Range {
    /// A count: at least 1.
    AtLeastOne,
    /// A finite number >= 0.
    NonNegative,
    /// A finite number > 0.
    Positive,
    /// `[0, 1)`: a momentum, a beta.
    Fraction,
    /// `(0, 1]`: a share that may be the whole.
    Share,
    /// `(0, 1)`: a share that leaves some on each side.
    Proper,
}

impl Range {
    fn holds(self, v: f64) -> bool {
        match self {
            Range::AtLeastOne => v >= 1.0,
            Range::NonNegative => v.is_finite() && v >= 0.0,
            Range::Positive => v.is_finite() && v > 0.0,
            Range::Fraction => (0.0..1.0).contains(&v),
            Range::Share => v > 0.0 && v <= 1.0,
            Range::Proper => v > 0.0 && v < 1.0,
        }
    }

    fn words(self) -> &'static str {
        match self {
            Range::AtLeastOne => "at least 1",
            Range::NonNegative => "a finite number >= 0",
            Range::Positive => "a finite number > 0",
            Range::Fraction => "in [0, 1)",
            Range::Share => "in (0, 1]",
            Range::Proper => "in (0, 1)",
        }
    }
}

impl RunConfig {
    /// Checks every value that serde cannot; the error names the key.
    pub fn validate(&self) -> Result<()> {
        self.model
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid [model]: {e}"))?;
        let (t, d) = (&self.train, &self.data);
        let count = |n: usize| n as f64;
        use Range::*;
        let numbers = [
            ("train.batch_size", count(t.batch_size), AtLeastOne),
            ("train.grad_accum", count(t.grad_accum), AtLeastOne),
            ("train.eval_interval", count(t.eval_interval), AtLeastOne),
            ("train.eval_iters", count(t.eval_iters), AtLeastOne),
            ("train.log_interval", count(t.log_interval), AtLeastOne),
            (
                "train.nonfinite_limit",
                count(t.nonfinite_limit),
                AtLeastOne,
            ),
            ("train.learning_rate", t.learning_rate, Positive),
            ("train.min_lr", t.min_lr, NonNegative),
            ("train.weight_decay", t.weight_decay, NonNegative),
            ("train.grad_clip", t.grad_clip, NonNegative),
            ("train.decay_fraction", t.decay_fraction, Share),
            ("train.muon_momentum", t.muon_momentum, Fraction),
            ("train.muon_momentum_start", t.muon_momentum_start, Fraction),
            (
                "train.muon_learning_rate",
                t.muon_learning_rate,
                NonNegative,
            ),
            ("train.muon_weight_decay", t.muon_weight_decay, NonNegative),
            ("train.embedding_lr_ratio", t.embedding_lr_ratio, Positive),
            ("train.head_lr_ratio", t.head_lr_ratio, Positive),
            ("train.beta1", t.beta1, Fraction),
            ("train.beta2", t.beta2, Fraction),
            ("data.val_fraction", d.val_fraction, Proper),
        ];
        for (key, value, range) in numbers {
            if !range.holds(value) {
                bail!("`{key}` must be {}, got {value}", range.words());
            }
        }
        if t.min_lr > t.learning_rate {
            bail!(
                "`train.min_lr` ({}) must not exceed `train.learning_rate` ({})",
                t.min_lr,
                t.learning_rate
            );
        }
        if d.tokenizer == TokenizerKind::Bpe && !(262..=65536).contains(&d.bpe_vocab_size) {
            bail!(
                "`data.bpe_vocab_size` must be in 262..=65536 (256 byte tokens, 5 special tokens, merges), got {}",
                d.bpe_vocab_size
            );
        }
        if d.batching == Batching::Documents && d.separator.is_empty() {
            bail!("`data.separator` must not be empty with `data.batching = \"documents\"`");
        }
        if let Some(lora) = &self.lora {
            lora.validate(&self.model)?;
        }
        self.chat.validate()
    }
}
