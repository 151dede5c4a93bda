//! What a generation thread is given: the [`Model`] it shares with the others and each [`Job`];
//! an attention job is answered here, a completion by the batcher.

use std::panic::AssertUnwindSafe;

use anyhow::Result;
use tinygpt_model::{FusedDecoder, Gpt, GptConfig, Matrices};
use tokio::sync::{mpsc, oneshot};

use super::generation::{Event, Generation};
use crate::attention_maps::AttentionMaps;
use crate::backend::{EngineKind, Placement};
use crate::data::tokenizer::Tokenizer;
use crate::decoder::DecodeWeights;

/// What the workers need of the model: what they decode on, where it lives, its tokenizer.
pub struct Model {
    /// Its sizes and parts.
    pub config: GptConfig,
    pub decoding: Decoding,
    pub placement: Placement,
    pub tokenizer: Tokenizer,
    /// How the decoder keeps the matrices (`--weights`).
    pub weights: DecodeWeights,
}

/// What the workers decode on.
pub enum Decoding {
    /// Burn's model (on wgpu or CUDA, or a CPU backend the fused decoder does not run).
    Burn(Box<Gpt>),
    /// The fused CPU decoder's weights (rows of f32 or int8), made once for every worker to
    /// decode on ([`FusedBatch::sharing`](tinygpt_model::FusedBatch::sharing)) and for the
    /// playground's attention maps. Burn's model is not kept: the decoder holds every weight.
    Fused(Box<FusedDecoder>),
}

impl Model {
    /// `gpt` served from `placement`; on the fused engine its decoder's weights are made here
    /// (with `matrices` where given, else `weights`' own) and `gpt` is dropped.
    pub fn new(
        gpt: Gpt,
        placement: Placement,
        tokenizer: Tokenizer,
        (weights, matrices): (DecodeWeights, Option<Matrices>),
    ) -> Result<Self> {
        let engine = crate::decoder::sampling_engine(&placement)?;
        let config = gpt.config().clone();
        let decoding = match engine {
            EngineKind::Fused => {
                let matrices = match matrices {
                    Some(matrices) => matrices,
                    None => weights.matrices(engine)?,
                };
                let decoder = FusedDecoder::with_weights(&gpt, matrices)?;
                drop(gpt);
                Decoding::Fused(Box::new(decoder))
            }
            EngineKind::Autodiff | EngineKind::Device => {
                Decoding::Burn(Box::new(weights.weights.cast(gpt)?))
            }
        };
        // Making the decoder's rows (and dropping Burn's model) freed memory.
        crate::decoder::return_freed_memory();
        Ok(Self {
            config,
            decoding,
            placement,
            tokenizer,
            weights,
        })
    }

    /// How many layers' maps an attention request makes: the decoder computes only the layer
    /// asked for; Burn's forward computes every layer whatever is asked.
    pub(crate) fn attention_layers(&self, layer: Option<usize>) -> usize {
        match self.decoding {
            Decoding::Burn(_) => self.config.n_layer,
            Decoding::Fused(_) => layer.map_or(self.config.n_layer, |_| 1),
        }
    }
}

/// Work for a generation thread.
pub enum Job {
    Complete {
        generation: Generation,
        /// Text as it is generated, then [`Event::Finished`] per choice; closed when the job
        /// ends. Bounded: a client that reads slowly holds its generation back instead of
        /// piling text up in memory. Dropping the receiver (a client that went away) cancels
        /// the generation at its next token.
        events: mpsc::Sender<Event>,
    },
    Attention {
        ids: Vec<u32>,
        /// The one layer whose maps are wanted (all when `None`).
        layer: Option<usize>,
        reply: oneshot::Sender<Result<AttentionMaps>>,
    },
}

/// Answers an attention job (other jobs are left alone).
pub(super) fn run_attention(model: &Model, job: Job) {
    let Job::Attention { ids, layer, reply } = job else {
        return;
    };
    let maps = std::panic::catch_unwind(AssertUnwindSafe(|| match &model.decoding {
        Decoding::Burn(gpt) => {
            AttentionMaps::of_tokens(gpt, &model.tokenizer, &ids, &model.placement.device)
        }
        Decoding::Fused(weights) => {
            AttentionMaps::of_decoder(&mut weights.share(), &model.tokenizer, &ids, layer)
        }
    }))
    .unwrap_or_else(|_| Err(anyhow::anyhow!("internal error computing attention")));
    let _ = reply.send(maps);
}
