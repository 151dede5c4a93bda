//! # Training or not, said at each call
//!
//! Dropout acts while training and not while evaluating or sampling. PyTorch keeps that choice
//! in the module (`model.train()`, `model.eval()`), a switch left on by mistake as easily as
//! off. Here each forward says it with a [`Pass`]: one layer serves a training step and a
//! sampler at once, and what it computes depends on nothing set elsewhere.
//!
//! The pass also picks the attention core: a training pass takes one with a backward (the
//! explicit core on a CPU, [`flash`](crate::flash) on a GPU), an inference pass the fastest
//! without one (Burn's scaled dot-product attention op) where the layer's
//! [`AttentionKernel`](crate::AttentionKernel) leaves the choice to it.

use burn::nn::Dropout;
use burn::tensor::Tensor;

/// Whether a forward is part of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// A training step's forward, on a device that tracks gradients: dropout acts (with the
    /// probability each layer was built with), the core is one with a backward.
    Train,
    /// Evaluation, sampling, serving: no dropout, the core need not have a backward.
    Infer,
}

impl Pass {
    /// `x` through `dropout` on a training pass, `x` itself on an inference pass.
    pub fn dropout<const D: usize>(self, dropout: &Dropout, x: Tensor<D>) -> Tensor<D> {
        match self {
            Pass::Train => dropout.forward(x),
            Pass::Infer => x,
        }
    }

    /// Whether `dropout` zeroes anything on this pass.
    pub fn drops(self, dropout: &Dropout) -> bool {
        self == Pass::Train && dropout.prob > 0.0 && dropout.training.is_enabled()
    }
}
