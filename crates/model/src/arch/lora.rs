//! LoRA (Hu et al., 2021): a frozen matrix `W [d_in, d_out]` learns a low-rank update instead of
//! itself,
//!
//! ```text
//! y = x · (W + (alpha / rank) · A · B)        A [d_in, rank] ~ N(0, 1/rank), B [rank, d_out] = 0
//! ```
//!
//! so a step trains `rank · (d_in + d_out)` numbers per matrix instead of `d_in · d_out`, and the
//! model starts exactly as the base (B is zero). [`LoraConfig`] says which of a block's matrices
//! get an adapter ([`LoraTarget`]), of which rank and scale; the adapters' two factors are
//! parameters of their own ([`Slot::Adapter`](super::Slot::Adapter)). Merged, `W + (alpha/rank)
//! · A · B` is an ordinary weight again: what sampling, serving and every export read.

use super::q8_0::round_columns;
use super::quants::{BlockType, rounded};
use serde::{Deserialize, Serialize};
use strum::{EnumIter, IntoEnumIterator};

use super::config::GptConfig;
use super::parts::Mlp;
use crate::error::GptConfigError;

/// One of a block's matrices an adapter can be attached to. Packed matrices take one adapter
/// whole: `qkv`'s columns are the queries', keys' and values' (its `A` is shared by the three,
/// its `B` splits by columns), `fc`'s are SwiGLU's gate and up projections.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, EnumIter,
)]
#[serde(rename_all = "snake_case")]
pub enum LoraTarget {
    /// `attn.c_attn`, `[n_embd, qkv_width]`: queries, keys and values.
    Qkv,
    /// `attn.c_proj`, `[n_embd, n_embd]`: the heads' outputs back to the stream.
    AttnProj,
    /// `mlp.c_fc`, `[n_embd, fc_width]`: the MLP's input (SwiGLU's gate and up).
    Fc,
    /// `mlp.c_proj`, `[mlp_width, n_embd]`: the MLP's output.
    MlpProj,
}

impl LoraTarget {
    /// Every target, in a block's order.
    pub fn all() -> impl Iterator<Item = Self> + Clone {
        Self::iter()
    }

    /// Its name in a `[lora]` table's `targets`.
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Qkv => "qkv",
            LoraTarget::AttnProj => "attn_proj",
            LoraTarget::Fc => "fc",
            LoraTarget::MlpProj => "mlp_proj",
        }
    }

    /// The matrix's path under a block (Burn's and nanoGPT's alike).
    pub fn path(self) -> &'static str {
        match self {
            LoraTarget::Qkv => "attn.c_attn",
            LoraTarget::AttnProj => "attn.c_proj",
            LoraTarget::Fc => "mlp.c_fc",
            LoraTarget::MlpProj => "mlp.c_proj",
        }
    }

    /// `(d_in, d_out)` of the matrix in a model of `config`; `None` where it has no such
    /// matrix (the MLP's with `mlp = "none"`).
    pub fn shape(self, config: &GptConfig) -> Option<(usize, usize)> {
        let c = config.n_embd;
        let mlp = match config.mlp {
            Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => true,
            Mlp::None => false,
        };
        match self {
            LoraTarget::Qkv => Some((c, config.qkv_width())),
            LoraTarget::AttnProj => Some((c, c)),
            LoraTarget::Fc => mlp.then(|| (c, config.fc_width())),
            LoraTarget::MlpProj => mlp.then(|| (config.mlp_width(), c)),
        }
    }
}

/// Which factor of an adapter: `A [d_in, rank]` or `B [rank, d_out]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EnumIter)]
pub enum Factor {
    A,
    B,
}

impl Factor {
    /// Both, `A` first.
    pub fn all() -> impl Iterator<Item = Self> + Clone {
        Self::iter()
    }

    /// Its name in Burn's module path (`…c_attn.weight.lora.a`).
    pub fn name(self) -> &'static str {
        match self {
            Factor::A => "a",
            Factor::B => "b",
        }
    }

    /// Its shape for a matrix `[d_in, d_out]` and `rank`.
    pub fn shape(self, (d_in, d_out): (usize, usize), rank: usize) -> Vec<usize> {
        match self {
            Factor::A => vec![d_in, rank],
            Factor::B => vec![rank, d_out],
        }
    }
}

/// A part of the base that trains in full beside the adapters (`[lora] also_train`, PEFT's
/// `modules_to_save`): what a fine-tune needs when it teaches tokens the base has never seen
/// (a chat format's markers), whose embeddings and logits no adapter on the blocks can move.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, EnumIter,
)]
#[serde(rename_all = "snake_case")]
pub enum TrainedPart {
    /// The token embedding `wte`, and the learned positions `wpe` and bigram table where the
    /// model has them. With a tied head this is the head too.
    Embedding,
    /// The LM head: `lm_head`, or with a tied head the token embedding it reads.
    Head,
}

impl TrainedPart {
    /// Its name in a `[lora]` table's `also_train`.
    pub fn name(self) -> &'static str {
        match self {
            TrainedPart::Embedding => "embedding",
            TrainedPart::Head => "head",
        }
    }
}

/// The adapters a LoRA fine-tune trains (the trainer's `[lora]` table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// The factors' inner size: each adapted matrix trains `rank · (d_in + d_out)` numbers.
    pub rank: usize,
    /// The update's scale is `alpha / rank`; default: twice the rank (a scale of 2, as
    /// PEFT's examples and Unsloth's defaults use).
    #[serde(default)]
    pub alpha: Option<f64>,
    /// The probability each input of an adapter is zeroed while training (the others scaled
    /// by `1/(1-p)`), PEFT's `lora_dropout`: the frozen product sees the whole input, the
    /// low-rank path a dropped one. Default 0 (none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropout: f64,
    /// The matrices of every block that get an adapter; default (`None`): every one the
    /// model has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<LoraTarget>>,
    /// How the frozen base's matrices are held: `f32` (default), `q8_0` (QLoRA's idea in
    /// GGUF's int8 blocks, [`BaseWeights::Q8_0`]) or `q4_k` (in four bits,
    /// [`BaseWeights::Q4K`]).
    #[serde(default, skip_serializing_if = "BaseWeights::is_f32")]
    pub base: BaseWeights,
    /// Parts of the base trained in full beside the adapters ([`TrainedPart`], PEFT's
    /// `modules_to_save`); default none. Checkpoints then hold those parts too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_train: Vec<TrainedPart>,
}

/// The values a LoRA run's frozen base computes with in its blocks' four matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseWeights {
    /// The base's own weights.
    #[default]
    F32,
    /// Each matrix rounded to GGUF's `Q8_0` (blocks of 32 weights along an output's inputs,
    /// an f16 scale each, as `export --dtype q8_0` writes them) before the adapters are
    /// attached, as QLoRA trains on a quantised base: the fused CPU engine then holds the
    /// base in int8 (1.0625 bytes a weight instead of 4) and multiplies by it dequantised a
    /// block at a time; Burn's engines hold the same values in f32. A matrix whose inputs
    /// are not whole blocks of 32 stays f32. Embeddings, norms, biases and an untied head
    /// stay f32 too.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// Each matrix rounded to GGUF's `Q4_K` (super-blocks of 256 inputs, a 6-bit scale and
    /// minimum per 32, by ggml's own quantiser: what `export --dtype q4_k` writes), or where
    /// its inputs are not whole super-blocks to `Q5_0` (blocks of 32, llama.cpp's fallback),
    /// before the adapters are attached, as QLoRA trains on a 4-bit base: the fused CPU engine
    /// then holds the base in those blocks (0.5625 and 0.6875 bytes a weight instead of 4) and
    /// multiplies by it dequantised a block at a time; Burn's engines hold the same values in
    /// f32. A matrix whose inputs are not whole blocks of 32 stays f32, as do embeddings,
    /// norms, biases and an untied head.
    #[serde(rename = "q4_k")]
    Q4K,
}

impl BaseWeights {
    fn is_f32(&self) -> bool {
        *self == Self::F32
    }

    /// The blocks this base holds a frozen matrix of `n_in` inputs in: `Q8_0`; `Q4_K`, or
    /// `Q5_0` where the inputs are not whole super-blocks; `None` (f32) for `f32`, and where
    /// the inputs are not whole blocks of 32.
    pub fn held_as(self, n_in: usize) -> Option<BlockType> {
        let fits = |kind: BlockType| n_in.is_multiple_of(kind.values()).then_some(kind);
        match self {
            Self::F32 => None,
            Self::Q8_0 => fits(BlockType::Q8_0),
            Self::Q4K => fits(BlockType::Q4_K).or_else(|| fits(BlockType::Q5_0)),
        }
    }

    /// `w [n_in, n_out]` rounded along its inputs to the blocks this base holds it in
    /// ([`held_as`](Self::held_as); unchanged where none): the values Burn's model computes
    /// with once its adapters are attached, and which the fused engine holds again bit for bit.
    pub(crate) fn round(self, w: &mut Vec<f32>, n_in: usize) {
        match self.held_as(n_in) {
            None => {}
            Some(BlockType::Q8_0) => round_columns(w, n_in),
            Some(kind) => *w = rounded(w, n_in, kind),
        }
    }

    /// Its name in a `[lora]` table.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
        }
    }
}

impl LoraConfig {
    /// Adapters of `rank` on every matrix, `alpha = 2·rank`.
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            alpha: None,
            dropout: 0.0,
            targets: None,
            base: BaseWeights::F32,
            also_train: Vec::new(),
        }
    }

    /// The matrices adapted in a model of `config`: those named, or every one it has.
    pub fn targets(&self, config: &GptConfig) -> Vec<LoraTarget> {
        match &self.targets {
            Some(named) => named.clone(),
            None => LoraTarget::all()
                .filter(|t| t.shape(config).is_some())
                .collect(),
        }
    }

    /// `alpha / rank`: what `A · B` is multiplied by.
    pub fn scale(&self) -> f64 {
        self.alpha.unwrap_or(2.0 * self.rank as f64) / self.rank as f64
    }

    /// Refuses what no model of `config` could train: a rank of 0 or above a matrix's smaller
    /// side (no longer low-rank), an alpha that is not a positive number, a dropout outside
    /// `[0, 1)`, no targets, a target or a part to train named twice, or a target the model
    /// lacks (an MLP matrix without an MLP).
    pub fn validate(&self, config: &GptConfig) -> Result<(), GptConfigError> {
        let bad = |why: String| Err(GptConfigError::Lora(why));
        if self.rank == 0 {
            return bad("`rank` must be at least 1".into());
        }
        if let Some(alpha) = self.alpha
            && !(alpha.is_finite() && alpha > 0.0)
        {
            return bad(format!("`alpha = {alpha}` must be a positive number"));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            let p = self.dropout;
            return bad(format!("`dropout = {p}` must be at least 0 and below 1"));
        }
        for (i, part) in self.also_train.iter().enumerate() {
            if self.also_train[..i].contains(part) {
                return bad(format!("`also_train` names `{}` twice", part.name()));
            }
        }
        let targets = self.targets(config);
        if targets.is_empty() {
            return bad("`targets` is empty: name at least one matrix".into());
        }
        for (i, &target) in targets.iter().enumerate() {
            if targets[..i].contains(&target) {
                return bad(format!("`targets` names `{}` twice", target.name()));
            }
            let Some((d_in, d_out)) = target.shape(config) else {
                let name = target.name();
                return bad(format!("`{name}`: the model has no MLP (mlp = \"none\")"));
            };
            if self.rank > d_in.min(d_out) {
                let (rank, name) = (self.rank, target.name());
                return bad(format!(
                    "`rank = {rank}` is larger than `{name}` ([{d_in}, {d_out}]): at most {}",
                    d_in.min(d_out)
                ));
            }
        }
        Ok(())
    }

    /// One line for a person: rank, scale, targets, what trains and the base, e.g. `rank 16
    /// (alpha 32) on qkv, attn_proj, fc, mlp_proj: 1.2M numbers trained, with embedding, head;
    /// base q8_0`.
    pub fn describe(&self, config: &GptConfig) -> String {
        let targets: Vec<&str> = self.targets(config).iter().map(|t| t.name()).collect();
        let trained = self.num_params(config) + self.base_params_trained(config);
        let mut line = format!(
            "rank {} (alpha {}) on {}: {} numbers trained",
            self.rank,
            self.scale() * self.rank as f64,
            targets.join(", "),
            trained
        );
        if !self.also_train.is_empty() {
            let parts: Vec<&str> = self.also_train.iter().map(|p| p.name()).collect();
            line += &format!(", with {}", parts.join(", "));
        }
        if self.base != BaseWeights::F32 {
            line += &format!("; base {}", self.base.name());
        }
        line
    }

    /// Numbers the adapters of a model of `config` train.
    pub fn num_params(&self, config: &GptConfig) -> u64 {
        let per_block: usize = self
            .targets(config)
            .iter()
            .filter_map(|t| t.shape(config))
            .map(|(d_in, d_out)| self.rank * (d_in + d_out))
            .sum();
        (per_block * config.n_layer) as u64
    }
}

/// Whether a dropout is zero (left out of a written `[lora]` table).
fn is_zero(p: &f64) -> bool {
    *p == 0.0
}
