//! `tinygpt eval`: loss, bits per character (or byte) and perplexity over a whole text.

use anyhow::{Result, bail};
use burn::tensor::Device;
use tinygpt_model::{Gpt, IGNORE_INDEX, cross_entropy_counted};

use crate::data::tokenizer::Tokenizer;
use crate::data::{Split, sweep};

/// What [`evaluate`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation {
    /// Targets predicted.
    pub tokens: usize,
    /// Mean cross-entropy per token, in nats.
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// Bits per unit: the total information in bits divided by the characters (char) or bytes
    /// (BPE) predicted, what compares across tokenizers.
    pub bits_per_unit: f64,
}

/// Every token of `split` predicted once, from windows of up to `block_size` tokens of context
/// (the first token of each window has none: as in training).
pub fn evaluate(
    model: &Gpt,
    tokenizer: &Tokenizer,
    split: &Split,
    block_size: usize,
    device: &Device,
) -> Result<Evaluation> {
    let mut nats = 0.0;
    let mut tokens = 0;
    let mut units = 0;
    for batch in sweep(split, block_size, 16) {
        let counted = batch.counted_targets();
        units += batch
            .targets
            .iter()
            .filter(|&&t| t != IGNORE_INDEX)
            .map(|&t| tokenizer.units(t as u32))
            .sum::<usize>();
        let (inputs, targets) = batch.to_device(device);
        let logits = model.forward(inputs)?;
        let [b, s, v] = logits.dims();
        let kept = batch.kept_targets()?;
        let loss =
            cross_entropy_counted(logits.reshape([b * s, v]), targets, kept, model.kernels())?
                .into_scalar::<f32>() as f64;
        if !loss.is_finite() {
            bail!(
                "the loss is {loss} after {tokens} tokens: the model's outputs are not finite \
                 (its weights are damaged or training diverged)"
            );
        }
        nats += loss * counted as f64;
        tokens += counted;
    }
    let loss = nats / tokens.max(1) as f64;
    Ok(Evaluation {
        tokens,
        loss,
        perplexity: loss.exp(),
        bits_per_unit: nats / std::f64::consts::LN_2 / units.max(1) as f64,
    })
}
