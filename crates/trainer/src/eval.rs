//! `tinygpt eval`: loss, bits per character (or byte) and perplexity over a whole text.

use anyhow::{Result, bail};
use burn::tensor::{Device, Int, Tensor, TensorData};
use tinygpt_model::{FusedDecoder, Gpt, IGNORE_INDEX, Matrices, Pass, step::cross_entropy_counted};

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
        let logits = model.forward(inputs, Pass::Infer)?;
        let [b, s, v] = logits.dims();
        let kept = batch.kept_targets()?;
        let loss =
            cross_entropy_counted(logits.reshape([b * s, v]), targets, kept, model.kernels())?
                .into_scalar::<f32>() as f64;
        tally.add(loss * counted as f64, counted, tokenizer, &batch.targets)?;
    }
    Ok(tally.finish())
}

/// [`evaluate`] by the fused CPU decoder with its matrices kept as `matrices` says (`eval
/// --weights`): each window's logits row by row as sampling computes them, the loss summed in
/// f64.
pub fn evaluate_decoded(
    model: &Gpt,
    tokenizer: &Tokenizer,
    split: &Split,
    block_size: usize,
    matrices: impl Into<Matrices>,
) -> Result<Evaluation> {
    let mut decoder = FusedDecoder::with_weights(model, matrices)?;
    let mut tally = Tally::default();
    for_each_window(split, block_size, usize::MAX, |ids, targets| {
        let (mut nats, mut counted) = (0.0, 0);
        decoder.window_logits(ids, |r, logits| {
            if let Ok(target) = usize::try_from(targets[r]) {
                nats += negative_log_likelihood(logits, target);
                counted += 1;
            }
        })?;
        tally.add(nats, counted, tokenizer, targets)?;
        Ok(counted)
    })?;
    Ok(tally.finish())
}

/// Calls `f` with each window of `split` as [`evaluate`] windows it (up to `block_size`
/// tokens): its ids, fed up to its last target (padding after it changes no earlier row), and
/// its targets; `f` returns the targets it counted. Stops once `max_tokens` were counted.
fn for_each_window(
    split: &Split,
    block_size: usize,
    max_tokens: usize,
    mut f: impl FnMut(&[u32], &[i64]) -> Result<usize>,
) -> Result<()> {
    let mut counted = 0;
    for batch in sweep(split, block_size, 16) {
        let rows = batch
            .inputs
            .chunks(batch.seq)
            .zip(batch.targets.chunks(batch.seq));
        for (inputs, targets) in rows {
            if counted >= max_tokens {
                return Ok(());
            }
            let Some(last) = targets.iter().rposition(|&t| t != IGNORE_INDEX) else {
                continue;
            };
            let ids: Vec<u32> = inputs[..=last].iter().map(|&t| t as u32).collect();
            counted += f(&ids, targets)?;
        }
    }
    Ok(())
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

/// How [`compare`] computes a model's logits: Burn's forward (on the model's device, its
/// matrices as they are or cast, as `eval --weights bf16|f16` scores), or the fused CPU decoder
/// (as `eval --weights q8_0` scores).
pub enum Scorer<'a> {
    Forward(&'a Gpt),
    Decoded(Box<FusedDecoder>),
}

impl Scorer<'_> {
    /// The logits of every position of the window `ids`, a row at a time.
    fn window(&mut self, ids: &[u32], mut row: impl FnMut(usize, &[f32])) -> Result<()> {
        match self {
            Scorer::Forward(model) => {
                let device = model.wte.weight.device();
                let data: Vec<i64> = ids.iter().map(|&t| t as i64).collect();
                let inputs =
                    Tensor::<2, Int>::from_data(TensorData::new(data, [1, ids.len()]), &device);
                let logits = model.forward(inputs, Pass::Infer)?;
                let vocab = logits.dims()[2];
                let values: Vec<f32> = logits
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .map_err(|e| anyhow::anyhow!("the logits cannot be read: {e:?}"))?;
                for (r, logits) in values.chunks(vocab).enumerate() {
                    row(r, logits);
                }
                Ok(())
            }
            Scorer::Decoded(decoder) => Ok(decoder.window_logits(ids, row)?),
        }
    }
}

/// Two models scored on the same windows of `split`, and how far apart their logits are.
#[derive(Debug, Clone, Copy)]
pub struct Comparison {
    pub reference: Evaluation,
    pub other: Evaluation,
    /// The largest `|reference − other|` over every logit of every position.
    pub max_logit_difference: f64,
    /// The largest `|reference|` logit, for scale.
    pub max_logit: f64,
}

/// `reference` and `other` predicting the tokens of `split`'s windows of up to `block_size`
/// tokens (as [`evaluate`] windows them), the first `max_tokens` targets or so: each one's loss
/// (summed in f64 from its logits) and the largest difference between their logits.
pub fn compare(
    mut reference: Scorer,
    mut other: Scorer,
    tokenizer: &Tokenizer,
    split: &Split,
    block_size: usize,
    max_tokens: usize,
) -> Result<Comparison> {
    let (mut tallies, mut worst, mut scale) = ([Tally::default(), Tally::default()], 0f64, 0f64);
    for_each_window(split, block_size, max_tokens, |ids, targets| {
        let mut rows = Vec::with_capacity(ids.len());
        reference.window(ids, |_, logits| rows.push(logits.to_vec()))?;
        let (mut nats, mut counted) = ([0.0, 0.0], 0);
        other.window(ids, |r, logits| {
            for (a, b) in rows[r].iter().zip(logits) {
                worst = worst.max((a - b).abs() as f64);
                scale = scale.max(a.abs() as f64);
            }
            if let Ok(target) = usize::try_from(targets[r]) {
                nats[0] += negative_log_likelihood(&rows[r], target);
                nats[1] += negative_log_likelihood(logits, target);
                counted += 1;
            }
        })?;
        for (tally, nats) in tallies.iter_mut().zip(nats) {
            tally.add(nats, counted, tokenizer, targets)?;
        }
        Ok(counted)
    })?;
    Ok(Comparison {
        reference: tallies[0].finish(),
        other: tallies[1].finish(),
        max_logit_difference: worst,
        max_logit: scale,
    })
}
