//! The GPT's parameters under both namings, in one table: Burn's module paths (`h.0.ln_1.gamma`,
//! `[in, out]` linear weights) and nanoGPT's / GPT-2's `state_dict` names
//! (`transformer.h.0.ln_1.weight`, `[out, in]`). The fused CPU engine stores its buffers in this
//! order, the flat optimizer layout ([`ParamLayout`]) lays them end to end in it, and export and
//! import walk it. The Burn modules themselves (`gpt.rs`, `block.rs`) declare the same
//! parameters as fields; `the_table_names_every_parameter_once` checks that the two agree.

use super::config::GptConfig;
use super::lora::{Factor, LoraConfig, LoraTarget, TrainedPart};
use super::parts::{Mlp, Norm, Position};

/// One parameter slot of a GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamName {
    /// Which parameter it is, whatever its name.
    pub slot: Slot,
    /// Burn's module path, e.g. `h.0.attn.c_attn.weight`.
    pub burn: String,
    /// nanoGPT's `state_dict` name, e.g. `transformer.h.0.attn.c_attn.weight`.
    pub nanogpt: String,
    /// A linear layer's weight: `[in, out]` in Burn, `[out, in]` in PyTorch.
    pub transposed: bool,
    /// Whether a model of this config has it ([`Slot::present`]).
    pub present: bool,
}

/// Which parameter of the architecture a slot holds: what code that stores parameters by kind
/// (the fused CPU engine's buffers) matches on, exhaustively.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// `wte`, `[vocab_size, n_embd]`; also the LM head when tied.
    TokenEmbedding,
    /// `wpe`, `[block_size, n_embd]`.
    PositionEmbedding,
    /// `bigram`, `[(vocab_size + 1)·vocab_size, n_embd]` ([`GptConfig::bigram`]).
    BigramEmbedding,
    /// A parameter of block `l`.
    Block(usize, BlockSlot),
    /// `ln_f`'s gain and bias, `[n_embd]`.
    FinalNormGain,
    FinalNormBias,
    /// The untied head, `[n_embd, vocab_size]`.
    LmHead,
    /// A factor of the LoRA adapter on block `layer`'s `target` matrix, of `rank`
    /// ([`LoraConfig`](super::LoraConfig)): never in the table, which lists what a config
    /// implies; a model has it when adapters are attached
    /// ([`Gpt::with_lora`](crate::Gpt::with_lora)).
    Adapter {
        layer: usize,
        target: LoraTarget,
        factor: Factor,
        rank: usize,
    },
}

impl GptConfig {
    /// How many parameters a model of this config has, computed without building it (what
    /// [`Gpt::num_params`](crate::Gpt::num_params) counts once built): the present slots of
    /// its [`parameter_table`], each of the shape [`Slot::shape`] gives. Saturates instead of
    /// overflowing.
    pub fn num_params(&self) -> u64 {
        // f64 counts exactly up to 2^53 parameters; `as u64` saturates beyond u64.
        let total: f64 = parameter_table(self)
            .iter()
            .filter(|p| p.present)
            .map(|p| {
                p.slot
                    .shape(self)
                    .iter()
                    .map(|&n| n as f64)
                    .product::<f64>()
            })
            .sum();
        total as u64
    }
}

/// Whether a model of `config` has a norm's gain and its shift.
fn norm_parameters(config: &GptConfig) -> (bool, bool) {
    match config.norm {
        Norm::Layer => (true, config.bias),
        Norm::Rms => (true, false),
        Norm::RmsUnit | Norm::None => (false, false),
    }
}

impl Slot {
    /// Whether a model of `config` has this parameter.
    pub fn present(self, config: &GptConfig) -> bool {
        let (gain, shift) = norm_parameters(config);
        match self {
            Slot::TokenEmbedding => true,
            Slot::PositionEmbedding => match config.position {
                Position::Learned => true,
                Position::Rope | Position::None => false,
            },
            Slot::BigramEmbedding => config.bigram,
            Slot::Block(_, slot) => slot.present(config),
            Slot::FinalNormGain => gain,
            Slot::FinalNormBias => shift,
            Slot::LmHead => !config.tie_embeddings,
            Slot::Adapter { .. } => false,
        }
    }

    /// The shape a model of `config` gives this parameter (Burn's, `[in, out]` for a linear
    /// weight): what [`Gpt::check_config`](crate::Gpt::check_config) holds a model's tensors to.
    pub fn shape(self, config: &GptConfig) -> Vec<usize> {
        let (c, v) = (config.n_embd, config.vocab_size);
        match self {
            Slot::TokenEmbedding => vec![v, c],
            Slot::PositionEmbedding => vec![config.block_size, c],
            Slot::BigramEmbedding => vec![config.bigram_rows(), c],
            Slot::Block(_, slot) => slot.shape(config),
            Slot::FinalNormGain | Slot::FinalNormBias => vec![c],
            Slot::LmHead => vec![c, v],
            Slot::Adapter {
                target,
                factor,
                rank,
                ..
            } => target
                .shape(config)
                .map(|matrix| factor.shape(matrix, rank))
                .unwrap_or_default(),
        }
    }
}

impl BlockSlot {
    fn present(self, config: &GptConfig) -> bool {
        let (gain, shift) = norm_parameters(config);
        let mlp = match config.mlp {
            Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu => true,
            Mlp::None => false,
        };
        match self {
            BlockSlot::Ln1Gain | BlockSlot::Ln2Gain => gain,
            BlockSlot::Ln1Bias | BlockSlot::Ln2Bias => shift,
            BlockSlot::AttnWeight | BlockSlot::AttnProjWeight => true,
            BlockSlot::AttnBias | BlockSlot::AttnProjBias => config.bias,
            BlockSlot::FcWeight | BlockSlot::MlpProjWeight => mlp,
            BlockSlot::FcBias | BlockSlot::MlpProjBias => mlp && config.bias,
        }
    }

    fn shape(self, config: &GptConfig) -> Vec<usize> {
        let (c, hidden, qkv) = (config.n_embd, config.mlp_width(), config.qkv_width());
        let fc = config.fc_width();
        match self {
            BlockSlot::Ln1Gain | BlockSlot::Ln1Bias | BlockSlot::Ln2Gain | BlockSlot::Ln2Bias => {
                vec![c]
            }
            BlockSlot::AttnWeight => vec![c, qkv],
            BlockSlot::AttnBias => vec![qkv],
            BlockSlot::AttnProjWeight => vec![c, c],
            BlockSlot::AttnProjBias | BlockSlot::MlpProjBias => vec![c],
            BlockSlot::FcWeight => vec![c, fc],
            BlockSlot::FcBias => vec![fc],
            BlockSlot::MlpProjWeight => vec![hidden, c],
        }
    }
}

impl TrainedPart {
    /// Whether parameter `slot` of a model of `config` belongs to it. An exhaustive match: a
    /// new slot says whether it is part of the embedding or the head.
    pub fn holds(self, slot: Slot, config: &GptConfig) -> bool {
        let embedding = match slot {
            Slot::TokenEmbedding | Slot::PositionEmbedding | Slot::BigramEmbedding => true,
            Slot::Block(..)
            | Slot::FinalNormGain
            | Slot::FinalNormBias
            | Slot::LmHead
            | Slot::Adapter { .. } => false,
        };
        match self {
            TrainedPart::Embedding => embedding,
            TrainedPart::Head => {
                slot == Slot::LmHead || (config.tie_embeddings && slot == Slot::TokenEmbedding)
            }
        }
    }
}

impl LoraConfig {
    /// Whether base parameter `slot` of a model of `config` trains beside the adapters
    /// (`also_train` holds it).
    pub fn trains_base(&self, slot: Slot, config: &GptConfig) -> bool {
        self.also_train.iter().any(|part| part.holds(slot, config))
    }

    /// Numbers of the base a model of `config` trains beside the adapters (`also_train`).
    pub fn base_params_trained(&self, config: &GptConfig) -> u64 {
        let trained = trained_beside(config, &self.also_train).into_iter();
        trained
            .map(|p| p.slot.shape(config).iter().product::<usize>() as u64)
            .sum()
    }
}

/// The parameters of a model of `config` that `parts` train in full beside LoRA adapters, in
/// the table's order.
pub fn trained_beside(config: &GptConfig, parts: &[TrainedPart]) -> Vec<ParamName> {
    let table = parameter_table(config).into_iter().filter(|p| p.present);
    table
        .filter(|p| parts.iter().any(|part| part.holds(p.slot, config)))
        .collect()
}

impl LoraTarget {
    /// The slot of the matrix it adapts.
    pub fn weight(self) -> BlockSlot {
        match self {
            LoraTarget::Qkv => BlockSlot::AttnWeight,
            LoraTarget::AttnProj => BlockSlot::AttnProjWeight,
            LoraTarget::Fc => BlockSlot::FcWeight,
            LoraTarget::MlpProj => BlockSlot::MlpProjWeight,
        }
    }
}

/// A parameter of one block, in the table's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockSlot {
    /// `ln_1`, `[n_embd]` each.
    Ln1Gain,
    Ln1Bias,
    /// `attn.c_attn`: `[n_embd, qkv_width]` and `[qkv_width]` (`3·n_embd` without grouped
    /// heads).
    AttnWeight,
    AttnBias,
    /// `attn.c_proj`: `[n_embd, n_embd]` and `[n_embd]`.
    AttnProjWeight,
    AttnProjBias,
    /// `ln_2`, `[n_embd]` each.
    Ln2Gain,
    Ln2Bias,
    /// `mlp.c_fc`: `[n_embd, mlp_width]` and `[mlp_width]` (twice `mlp_width` for SwiGLU).
    FcWeight,
    FcBias,
    /// `mlp.c_proj`: `[mlp_width, n_embd]` and `[n_embd]`.
    MlpProjWeight,
    MlpProjBias,
}

/// Every slot of a model of `config`'s shape, in nanoGPT's order: `wte`, `wpe` (`bigram`), per block
/// `ln_1`, `attn.c_attn`, `attn.c_proj`, `ln_2`, `mlp.c_fc`, `mlp.c_proj` (weight, then bias),
/// `ln_f`, `lm_head`. Slots the model lacks ([`Slot::present`]: no biases without `bias`, no
/// LayerNorms or MLP in the teaching ablations, no head when tied) are kept with
/// `present: false`, so the positions do not depend on the config.
pub fn parameter_table(config: &GptConfig) -> Vec<ParamName> {
    let mut table = Vec::new();
    let mut slot = |slot: Slot, burn: String, nanogpt: String, transposed: bool| {
        table.push(ParamName {
            slot,
            burn,
            nanogpt,
            transposed,
            present: slot.present(config),
        })
    };
    for (kind, name) in [
        (Slot::TokenEmbedding, "wte"),
        (Slot::PositionEmbedding, "wpe"),
        (Slot::BigramEmbedding, "bigram"),
    ] {
        let (burn, torch) = (
            format!("{name}.weight"),
            format!("transformer.{name}.weight"),
        );
        slot(kind, burn, torch, false);
    }
    // Each layer's path under a block (Burn's and nanoGPT's alike), whether it is linear, and
    // the slots of its weight and bias.
    let layers = |l: usize| {
        BLOCK_LAYERS.map(move |(path, linear, (w, b))| {
            let (burn, torch) = (format!("h.{l}.{path}"), format!("transformer.h.{l}.{path}"));
            (burn, torch, linear, (Slot::Block(l, w), Slot::Block(l, b)))
        })
    };
    let ln_f = (
        "ln_f".to_string(),
        "transformer.ln_f".to_string(),
        false,
        (Slot::FinalNormGain, Slot::FinalNormBias),
    );
    for (burn, torch, linear, (weight, bias)) in (0..config.n_layer).flat_map(layers).chain([ln_f])
    {
        // Burn's LayerNorm calls its scale and shift `gamma` and `beta`.
        let (w, b) = if linear {
            ("weight", "bias")
        } else {
            ("gamma", "beta")
        };
        slot(
            weight,
            format!("{burn}.{w}"),
            format!("{torch}.weight"),
            linear,
        );
        let (b_burn, b_torch) = (format!("{burn}.{b}"), format!("{torch}.bias"));
        slot(bias, b_burn, b_torch, false);
    }
    let head = "lm_head.weight".to_string();
    slot(Slot::LmHead, head.clone(), head, true);
    table
}

/// A block's layers in nanoGPT's order: path, whether linear, the slots of weight and bias.
const BLOCK_LAYERS: [(&str, bool, (BlockSlot, BlockSlot)); 6] = [
    ("ln_1", false, (BlockSlot::Ln1Gain, BlockSlot::Ln1Bias)),
    (
        "attn.c_attn",
        true,
        (BlockSlot::AttnWeight, BlockSlot::AttnBias),
    ),
    (
        "attn.c_proj",
        true,
        (BlockSlot::AttnProjWeight, BlockSlot::AttnProjBias),
    ),
    ("ln_2", false, (BlockSlot::Ln2Gain, BlockSlot::Ln2Bias)),
    ("mlp.c_fc", true, (BlockSlot::FcWeight, BlockSlot::FcBias)),
    (
        "mlp.c_proj",
        true,
        (BlockSlot::MlpProjWeight, BlockSlot::MlpProjBias),
    ),
];
