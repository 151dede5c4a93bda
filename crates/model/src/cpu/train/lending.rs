//! [`LentWeights`]: the fused engine with its weights lent to Burn's model, for a checkpoint
//! or a sample. The trained weights are copied into the model; the frozen ones (LoRA's base)
//! are moved, so that they exist once. Lending takes the engine by value and reclaiming gives
//! it back, so a step or an evaluation while the base is in the model does not compile.
//! What needs no base from Burn's model is had without lending: a LoRA checkpoint's trained
//! weights ([`FusedCpu::trained_weights`]), a snapshot's attention maps
//! ([`FusedCpu::attention_maps`]) and a LoRA run's samples ([`FusedCpu::sample_with`]).

use super::fused::FusedCpu;
use super::workspace::{TokenBatch, Workspace};
use crate::cpu::error::FusedError;
use crate::nn::{Gpt, IGNORE_INDEX};

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

impl FusedCpu {
    /// A copy of `hollow` (this engine's model, as [`taking`](FusedCpu::taking) leaves it)
    /// holding the weights that train (a LoRA run's adapters, and the parts of its base
    /// trained beside them), copied; every frozen parameter an empty placeholder of its id.
    /// What a LoRA checkpoint writes (and nothing else may read it): lending would put a base
    /// held quantised out in f32 (1.3 GB at SmolLM2-360M's shape) to write none of it.
    pub fn trained_weights(&self, hollow: &Gpt) -> Gpt {
        self.weights.write_trained(hollow.clone())
    }

    /// The attention weights of `prompt` (one sequence of token ids) under the weights held
    /// here, a base held quantised included, without Burn's model: `maps[layer][head]`, each
    /// `[seq, seq]` row-major (rows queries, columns keys), as
    /// [`Gpt::forward_with_attention`] gives them. For a run's snapshots: lending the weights
    /// to Burn's model would put such a base out in f32.
    pub fn attention_maps(&mut self, prompt: &[i64]) -> Result<Vec<Vec<Vec<f32>>>, FusedError> {
        let targets = vec![IGNORE_INDEX; prompt.len()];
        self.check(&TokenBatch {
            inputs: prompt,
            targets: &targets,
            batch: 1,
            seq: prompt.len(),
        })?;
        // A workspace of its own, one block's activations at a time: the steps' keep their
        // sizes.
        let mut work = Workspace::default();
        work.checkpointing = true;
        Ok(work.attention_maps(self.dims, &self.weights, prompt))
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
