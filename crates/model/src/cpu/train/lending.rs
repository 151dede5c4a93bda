//! [`LentWeights`]: the fused engine with its weights lent to Burn's model, for a checkpoint
//! or a sample. The trained weights are copied into the model; the frozen ones (LoRA's base)
//! are moved, so that they exist once. Lending takes the engine by value and reclaiming gives
//! it back, so a step or an evaluation while the base is in the model does not compile.

use super::fused::FusedCpu;
use crate::nn::Gpt;

/// A [`FusedCpu`] whose weights are in [`model`](Self::model); see the module docs.
#[derive(Debug)]
pub struct LentWeights {
    fused: FusedCpu,
    model: Gpt,
}

impl FusedCpu {
    /// `hollow` (this engine's model, as [`taking`](FusedCpu::taking) or
    /// [`LentWeights::reclaim`] leave it) with the weights held here, as
    /// [`write_weights`](Self::write_weights) makes it, but the frozen ones (LoRA's base)
    /// moved into it rather than copied: they exist once, in the model. The engine goes with
    /// them: nothing steps or evaluates until [`LentWeights::reclaim`] gives it back.
    ///
    /// A base held quantised (`[lora] base = "q8_0"` or `"q4_k"`) goes to the model
    /// dequantised, in f32: [`release_buffers`](Self::release_buffers) first makes room for it.
    pub fn lend_weights(mut self, hollow: Gpt) -> LentWeights {
        let model = self.weights.lend(hollow);
        LentWeights { fused: self, model }
    }
}

impl LentWeights {
    /// The model with every weight the engine holds.
    pub fn model(&self) -> &Gpt {
        &self.model
    }

    /// The engine, to read what lending leaves readable (its optimizer state, its sizes);
    /// stepping and evaluating need it back ([`reclaim`](Self::reclaim)).
    pub fn fused(&self) -> &FusedCpu {
        &self.fused
    }

    /// Takes back the weights moved into the model: the engine, and the model hollow (every
    /// parameter a lazy one of the same id and shape; the engine's buffers hold the values),
    /// so that it holds no copy of the weights.
    pub fn reclaim(self) -> (FusedCpu, Gpt) {
        let Self { mut fused, model } = self;
        let hollow = fused.weights.reclaim(model);
        (fused, hollow)
    }
}
