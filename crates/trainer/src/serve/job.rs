//! What a generation thread is given: the [`Model`] it shares with the others and each [`Job`];
//! an attention job is answered here, a completion by the batcher.

use std::panic::AssertUnwindSafe;

use anyhow::Result;
use tinygpt_model::{FusedDecoder, Gpt};
use tokio::sync::{mpsc, oneshot};

use super::generation::{Event, Generation};
use crate::attention_maps::AttentionMaps;
use crate::backend::{EngineKind, Placement};
use crate::data::tokenizer::Tokenizer;
use crate::decoder::Weights;

/// What the workers need of the model: its weights, where they live, its tokenizer.
pub struct Model {
    pub gpt: Gpt,
    pub placement: Placement,
    pub tokenizer: Tokenizer,
    /// How the decoder keeps the matrices (`--weights`).
    pub weights: Weights,
    /// On the fused engine, the decoder's weights (rows of f32 or int8), made once for every
    /// worker to decode on ([`FusedBatch::sharing`](tinygpt_model::FusedBatch::sharing)).
    pub fused: Option<FusedDecoder>,
}

impl Model {
    /// `gpt` served from `placement`, with its decoder's weights made here when the workers
    /// decode on the fused engine.
    pub fn new(
        gpt: Gpt,
        placement: Placement,
        tokenizer: Tokenizer,
        weights: Weights,
    ) -> Result<Self> {
        let engine = crate::decoder::sampling_engine(&placement)?;
        let fused = match engine {
            EngineKind::Fused => Some(FusedDecoder::with_weights(&gpt, weights.format(engine)?)?),
            EngineKind::Autodiff | EngineKind::Device => None,
        };
        // Making the decoder's rows freed the weights' first layout.
        crate::decoder::return_freed_memory();
        Ok(Self {
            gpt,
            placement,
            tokenizer,
            weights,
            fused,
        })
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
        reply: oneshot::Sender<Result<AttentionMaps>>,
    },
}

/// Answers an attention job (other jobs are left alone).
pub(super) fn run_attention(model: &Model, job: Job) {
    let Job::Attention { ids, reply } = job else {
        return;
    };
    let maps = std::panic::catch_unwind(AssertUnwindSafe(|| {
        AttentionMaps::of_tokens(&model.gpt, &model.tokenizer, &ids, &model.placement.device)
    }))
    .unwrap_or_else(|_| Err(anyhow::anyhow!("internal error computing attention")));
    let _ = reply.send(maps);
}
