//! The snapshot each evaluation takes for watching a run learn (`evals.jsonl`, see
//! [`crate::run::journal`]): a short sample from a fixed prompt and the attention of every
//! layer and head on that prompt, so that a viewer can show them forming over training.

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::Device;
use tinygpt_model::{Decoder, GenerateOptions, generate};

use super::engine::Engine;
use crate::attention_maps::AttentionMaps;
use crate::config::RunConfig;
use crate::data::tokenizer::Tokenizer;
use crate::data::{Dataset, Split};
use crate::decoder::{Weights, decoder_for, unpadded};
use crate::run::journal::EvalLine;

/// The most tokens of the prompt whose attention is recorded: a heatmap a person can read, and
/// a journal line of a few tens of kilobytes.
pub(crate) const PROMPT_TOKENS: usize = 32;

/// The prompt every evaluation of a run of `config` uses: `train.sample_prompt`, or the start
/// of the validation split.
pub fn sample_prompt(
    config: &RunConfig,
    tokenizer: &Tokenizer,
    data: &Dataset,
) -> Result<Vec<u32>> {
    let most = PROMPT_TOKENS.min(config.model.block_size);
    let text = &config.train.sample_prompt;
    if text.is_empty() {
        return Ok(head(&data.val, most));
    }
    let ids = tokenizer
        .encode_with_specials(text)
        .context("`train.sample_prompt` cannot be written with this run's tokenizer")?;
    if ids.is_empty() || ids.len() > most {
        bail!(
            "`train.sample_prompt` is {} tokens; it must be 1 to {most}",
            ids.len()
        );
    }
    Ok(ids)
}

/// The first `n` tokens of `split` (its first document's, with documents).
fn head(split: &Split, n: usize) -> Vec<u32> {
    let mut ids = match split {
        Split::Packed(tokens) => tokens.slice(0, n.min(tokens.len())),
        Split::Documents(documents) => documents.window(0),
        // The first conversation up to its reply: the sample is the model's answer.
        Split::Conversations(c) => c.first_prompt(),
    };
    ids.truncate(n);
    ids
}

/// What an evaluation's snapshot is taken of.
pub(crate) struct Snapshot<'a> {
    /// The engine training the run: its maps and its sample where it computes them (the
    /// fused engine; its own decoder for a LoRA run's sample), and its model for the rest
    /// (asked for only when needed: the fused engine lends its weights to it).
    pub engine: &'a mut dyn Engine,
    pub tokenizer: &'a Tokenizer,
    pub device: &'a Device,
    pub prompt: &'a [u32],
    pub config: &'a RunConfig,
}

impl Snapshot<'_> {
    /// The journal line of the evaluation at `step` with these losses.
    pub fn line(&mut self, step: usize, (train_loss, val_loss): (f64, f64)) -> Result<EvalLine> {
        let maps = match self.engine.attention_maps(self.prompt)? {
            Some(maps) => {
                let block = self.engine.shapes()?.block_size();
                AttentionMaps::of_weights(self.tokenizer, self.prompt, block, maps)?
            }
            None => {
                // Without autodiff: nothing of the forward is kept for a backward.
                let model = self.engine.model()?.valid();
                AttentionMaps::of_tokens(&model, self.tokenizer, self.prompt, self.device)?
            }
        };
        let attention = maps
            .maps
            .iter()
            .map(|heads| {
                heads
                    .iter()
                    .map(|w| {
                        w.iter()
                            .map(|&p| (p.clamp(0.0, 1.0) * 255.0).round() as u8)
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Ok(EvalLine {
            step,
            train_loss,
            val_loss,
            prompt: maps.labels,
            sample: self.sample()?,
            attention,
        })
    }

    /// `train.sample_tokens` sampled after the prompt, with the run's seed: the same at the same
    /// step of a resumed run.
    fn sample(&mut self) -> Result<String> {
        let tokens = self.config.train.sample_tokens;
        if tokens == 0 {
            return Ok(String::new());
        }
        let vocab = self.tokenizer.vocab_size();
        let options = GenerateOptions {
            max_new_tokens: tokens,
            seed: self.config.train.seed,
            ..GenerateOptions::default()
        };
        let prompt = self.prompt;
        let mut sample = |decoder: &mut dyn Decoder| -> Result<Vec<u32>> {
            let mut decoder = unpadded(Box::new(decoder), vocab);
            Ok(generate(&mut *decoder, prompt, &options, |_| {})?)
        };
        let ids = match self.engine.sampled(&mut sample)? {
            Some(ids) => ids,
            None => {
                let kind = self.engine.kind();
                let model = self.engine.model()?;
                sample(&mut *decoder_for(kind, model, vocab, &Weights::F32.into())?)?
            }
        };
        self.tokenizer.decode(&ids)
    }
}
