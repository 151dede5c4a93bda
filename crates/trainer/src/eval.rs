//! `tinygpt eval`: loss, bits per character (or byte) and perplexity over a whole text.

use anyhow::{Result, bail};
use burn::tensor::Device;
use tinygpt_model::{FusedDecoder, Gpt, IGNORE_INDEX, WeightFormat, cross_entropy_counted};

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
    let mut tally = Tally::default();
    for batch in sweep(split, block_size, 16) {
        let counted = batch.counted_targets();
        let (inputs, targets) = batch.to_device(device);
        let logits = model.forward(inputs)?;
        let [b, s, v] = logits.dims();
        let kept = batch.kept_targets()?;
        let loss =
            cross_entropy_counted(logits.reshape([b * s, v]), targets, kept, model.kernels())?
                .into_scalar::<f32>() as f64;
        tally.add(loss * counted as f64, counted, tokenizer, &batch.targets)?;
    }
    Ok(tally.finish())
}

/// [`evaluate`] by the fused CPU decoder with its matrices in `format` (`eval --weights`): each
/// window's logits row by row as sampling computes them, the loss summed in f64.
pub fn evaluate_decoded(
    model: &Gpt,
    tokenizer: &Tokenizer,
    split: &Split,
    block_size: usize,
    format: WeightFormat,
) -> Result<Evaluation> {
    let mut decoder = FusedDecoder::with_weights(model, format)?;
    let mut tally = Tally::default();
    for batch in sweep(split, block_size, 16) {
        let rows = batch
            .inputs
            .chunks(batch.seq)
            .zip(batch.targets.chunks(batch.seq));
        for (inputs, targets) in rows {
            // Padding after the last target changes no earlier row: it is not fed.
            let Some(last) = targets.iter().rposition(|&t| t != IGNORE_INDEX) else {
                continue;
            };
            let ids: Vec<u32> = inputs[..=last].iter().map(|&t| t as u32).collect();
            let (mut nats, mut counted) = (0.0, 0);
            decoder.window_logits(&ids, |r, logits| {
                if let Ok(target) = usize::try_from(targets[r]) {
                    nats += negative_log_likelihood(logits, target);
                    counted += 1;
                }
            })?;
            tally.add(nats, counted, tokenizer, targets)?;
        }
    }
    Ok(tally.finish())
}

/// `-log softmax(logits)[target]`, in f64.
fn negative_log_likelihood(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let total: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    max + total.ln() - logits[target] as f64
}

/// The sums an evaluation adds up.
#[derive(Default)]
struct Tally {
    nats: f64,
    tokens: usize,
    units: usize,
}

impl Tally {
    /// `nats` summed over the `counted` targets of `targets` (padding is `IGNORE_INDEX`).
    fn add(
        &mut self,
        nats: f64,
        counted: usize,
        tokenizer: &Tokenizer,
        targets: &[i64],
    ) -> Result<()> {
        if !nats.is_finite() {
            bail!(
                "the loss is {} after {} tokens: the model's outputs are not finite (its \
                 weights are damaged or training diverged)",
                nats / counted.max(1) as f64,
                self.tokens
            );
        }
        self.units += targets
            .iter()
            .filter(|&&t| t != IGNORE_INDEX)
            .map(|&t| tokenizer.units(t as u32))
            .sum::<usize>();
        self.nats += nats;
        self.tokens += counted;
        Ok(())
    }

    fn finish(&self) -> Evaluation {
        let loss = self.nats / self.tokens.max(1) as f64;
        Evaluation {
            tokens: self.tokens,
            loss,
            perplexity: loss.exp(),
            bits_per_unit: self.nats / std::f64::consts::LN_2 / self.units.max(1) as f64,
        }
    }
}
