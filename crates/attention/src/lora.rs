//! # LoRA's dropout: the adapter reads a dropped-out input, the frozen matrix the whole one
//!
//! A LoRA adapter (Hu et al., 2021) on a frozen projection `W [d_in, d_out]` trains two thin
//! factors, `A [d_in, rank]` and `B [rank, d_out]`, and the layer computes
//! `x·W + s·(x·A)·B` (`s = alpha / rank`). Burn attaches one to a parameter
//! (`Module::apply_lora`): reading the weight then gives `W + s·A·B`, so a layer multiplies by
//! it as by any weight, and needs no code of its own for LoRA.
//!
//! PEFT's `lora_dropout` is the one thing that reading cannot express: while training, the
//! adapter's path sees the input with some of its features zeroed (the rest scaled by
//! `1/(1-p)`), the frozen path the input as it is:
//!
//! ```text
//! y = x·W + s·(drop(x)·A)·B + b
//! ```
//!
//! (dropping `x` before `W + s·A·B` would also drop what the frozen matrix sees, changing the
//! model the adapter is fitted to). [`project`] is that product: a layer whose weight carries an
//! adapter and whose adapter dropout is active multiplies in two paths; any other layer, and
//! every layer on an inference [`Pass`], is `x·W + b` as before.

use burn::nn::{Dropout, Linear};
use burn::tensor::Tensor;

use crate::Pass;

/// `x·W + b` for `x` `[batch, seq, d_in]` → `[batch, seq, d_out]`; on a training pass, a
/// weight carrying a LoRA adapter multiplies as `x·W₀ + s·(dropout(x)·A)·B + b`, `W₀` the
/// frozen base (no gradient), `A`, `B` and `s` the adapter's.
pub fn project(layer: &Linear, x: Tensor<3>, dropout: &Dropout, pass: Pass) -> Tensor<3> {
    let adapter = layer.weight.adapter();
    let (Some(adapter), true) = (adapter, pass.drops(dropout)) else {
        return layer.forward(x);
    };
    let base = layer.weight.base().unsqueeze::<3>();
    let frozen = x.clone().matmul(base);
    let a = adapter.a.val().unsqueeze::<3>();
    let b = adapter.b.val().unsqueeze::<3>();
    let low_rank = dropout.forward(x).matmul(a).matmul(b);
    let y = frozen + low_rank.mul_scalar(adapter.scale);
    match &layer.bias {
        Some(bias) => y + bias.val().unsqueeze::<3>(),
        None => y,
    }
}
