//! Sampling from a trained model, for `generate`, `serve` and `bench`: the decoder a
//! placement's engine calls for (the fused CPU decoder, or Burn's on the model's device), and
//! the guard that keeps a padded vocabulary's extra rows from ever being sampled.

use anyhow::Result;
use tinygpt_model::{
    BatchDecoder, Decoder, FusedBatch, FusedDecoder, Gpt, GptBatch, ModelError, Pick, Picked,
};

use crate::backend::{EngineKind, Placement};
use crate::config::{OptimizerKind, TrainDType};

/// The decoder that samples from `model` where `placement` runs it: the fused CPU decoder when
/// [`Placement::engine_for`] picks the fused engine, Burn on the model's device otherwise. A model whose vocabulary is
/// padded past the tokenizer's `tokens` ids only ever gives logits (and so samples) of real
/// tokens.
pub fn decoder<'a>(
    placement: &Placement,
    model: &'a Gpt,
    tokens: usize,
) -> Result<Box<dyn Decoder + 'a>> {
    decoder_for(
        placement
            .engine_for(TrainDType::F32, OptimizerKind::AdamW)?
            .0,
        model,
        tokens,
    )
}

/// [`decoder`], for the engine `kind` already decided.
pub fn decoder_for<'a>(
    kind: EngineKind,
    model: &'a Gpt,
    tokens: usize,
) -> Result<Box<dyn Decoder + 'a>> {
    let inner: Box<dyn Decoder + 'a> = match kind {
        EngineKind::Fused => Box::new(FusedDecoder::new(model)?),
        EngineKind::Autodiff | EngineKind::Device => Box::new(model.decoder()),
    };
    Ok(unpadded(inner, tokens))
}

/// A decoder of `streams` sequences at once (a server's requests) for `model` on the engine
/// `kind`: the fused CPU decoder's batch, or Burn's on the model's device.
pub fn batch_decoder<'a>(
    kind: EngineKind,
    model: &'a Gpt,
    streams: usize,
) -> Result<Box<dyn BatchDecoder + 'a>> {
    Ok(match kind {
        EngineKind::Fused => Box::new(FusedBatch::new(model, streams)?),
        EngineKind::Autodiff | EngineKind::Device => Box::new(GptBatch::new(model, streams)),
    })
}

/// `inner`, giving logits of the tokenizer's `tokens` ids only (a padded vocabulary's extra
/// rows are no tokens).
pub fn unpadded<'a>(inner: Box<dyn Decoder + 'a>, tokens: usize) -> Box<dyn Decoder + 'a> {
    match tokens < inner.vocab_size() {
        true => Box::new(Unpadded { inner, tokens }),
        false => inner,
    }
}

/// A decoder whose logits stop at the tokenizer's last id: a padded vocabulary's extra rows
/// are no tokens.
struct Unpadded<'a> {
    inner: Box<dyn Decoder + 'a>,
    tokens: usize,
}

impl Decoder for Unpadded<'_> {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn vocab_size(&self) -> usize {
        self.tokens
    }
    fn cached(&self) -> usize {
        self.inner.cached()
    }
    fn clear(&mut self) {
        self.inner.clear()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut logits = self.inner.feed(tokens)?;
        logits.truncate(self.tokens);
        Ok(logits)
    }
    fn picks_on_device(&self) -> bool {
        self.inner.picks_on_device()
    }
    /// `pick.vocab` is this decoder's `vocab_size`: the padding rows are never candidates.
    fn feed_and_pick(&mut self, tokens: &[u32], pick: &Pick) -> Result<Picked, ModelError> {
        self.inner.feed_and_pick(tokens, pick)
    }
}
