//! The architecture's variable parts, each an enum whose variants are the choices a model can
//! make, documented with the formula and who uses it.
//!
//! Every place that depends on a part (the Burn modules, the parameter table and count, the
//! fused CPU engine's allow-list, the memory estimate, each import and export format) decides
//! on it with a `match` that has no catch-all arm, so the compiler names each place a new
//! variant must visit before the variant builds.
//!
//! In TOML they are `model.position`, `model.norm` and `model.mlp`. Configs written before the
//! parts existed still read: `model.layer_norm = false` is `norm = "none"`, `model.mlp = false`
//! is `mlp = "none"`, and `model.activation = "gelu_tanh"` is `mlp = "gelu_tanh"`.

use serde::{Deserialize, Serialize};

/// Where a token's position enters the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    /// `learned` (GPT-2, nanoGPT): a learned `[block_size, n_embd]` table `wpe`, row `m` added
    /// to the token embedding at position `m`.
    #[default]
    Learned,
    /// `rope` (RoFormer; GPT-NeoX, Llama, nanochat): no table; each head's queries and keys are
    /// rotated by their position, pairs `(i, i + d_head/2)` by `m·θᵢ` with
    /// `θᵢ = rope_theta^(−2i/d_head)` (Hugging Face's `rotate_half` layout; see
    /// `tinygpt_attention::rope`). Scores then depend on distances only.
    Rope,
    /// `none`: no position signal at all (NoPE): the causal mask alone lets a model count.
    None,
}

/// The normalisation before attention, before the MLP and before the LM head (pre-norm).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// `layer` (GPT-2, nanoGPT): `(x − mean(x)) / √(var(x) + ε) · γ + β` over the channels, a
    /// learned gain `γ` and, with `bias`, a learned shift `β`.
    #[default]
    Layer,
    /// `rms` (T5, Llama): `x / √(mean(x²) + ε) · γ`, a learned gain and no shift: no mean to
    /// subtract, one reduction instead of two.
    Rms,
    /// `rms_unit` (nanochat): `x / √(mean(x²) + ε)`, RMSNorm with its gain fixed at 1, no
    /// parameters at all.
    RmsUnit,
    /// `none`: no normalisation at all, the teaching ablation of
    /// [`GptConfig::minimal`](crate::GptConfig::minimal) (written `layer_norm = false` before).
    None,
}

/// The feed-forward sublayer after attention in each block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    /// `gelu` (nanoGPT): `c_proj(gelu(c_fc(x)))`, hidden width `4·n_embd`, the exact GELU
    /// `x·Φ(x)` (Φ the normal CDF through `erf`; PyTorch's `F.gelu`).
    #[default]
    Gelu,
    /// `gelu_tanh` (GPT-2's `gelu_new`, Hugging Face checkpoints): the same with
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
    /// `relu2` (Primer, So et al. 2021; modded-nanogpt, nanochat): `c_proj(relu(c_fc(x))²)`,
    /// hidden width `4·n_embd`: as good as GELU or better for small GPTs, and cheaper.
    Relu2,
    /// `swiglu` (Shazeer 2020; PaLM, Llama): `c_proj(silu(gate) ⊙ up)` with `[gate | up] =
    /// c_fc(x)`, two hidden halves of `mlp_hidden` each (default `8·n_embd/3` rounded up to a
    /// multiple of 64, so its parameters match a 4× GELU MLP's).
    #[serde(rename = "swiglu")]
    SwiGlu,
    /// `none`: no MLP, the teaching ablation of [`GptConfig::minimal`](crate::GptConfig::minimal)
    /// (written `mlp = false` before).
    None,
}

impl Mlp {
    /// The nonlinearity between the two linear layers, when there is an MLP.
    pub fn activation(self) -> Option<crate::Activation> {
        match self {
            Mlp::Gelu => Some(crate::Activation::Gelu),
            Mlp::GeluTanh => Some(crate::Activation::GeluTanh),
            Mlp::Relu2 => Some(crate::Activation::Relu2),
            Mlp::SwiGlu => Some(crate::Activation::SwiGlu),
            Mlp::None => None,
        }
    }
}

/// How the projections onto the residual stream (attention's and the MLP's `c_proj`) start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProjInit {
    /// `scaled` (GPT-2): normal with standard deviation `0.02/√(2·n_layer)`, since each block
    /// adds to the residual stream twice and its variance must not grow with depth.
    #[default]
    Scaled,
    /// `zero` (modded-nanogpt, nanochat): all zeros, so every block starts as the identity and
    /// the first steps train the embeddings and head through a clean residual stream.
    Zero,
}

/// How `[model]` spelled the MLP before the parts: `mlp = true | false`, or a part's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub(crate) enum MlpSetting {
    On(bool),
    Part(Mlp),
}

/// The parts from the settings a config file may hold, the older spellings included; an error
/// names the keys that contradict each other.
pub(crate) fn resolve(
    norm: Option<Norm>,
    layer_norm: Option<bool>,
    mlp: Option<MlpSetting>,
    activation: Option<crate::Activation>,
) -> Result<(Norm, Mlp), String> {
    let norm = match (norm, layer_norm) {
        (Some(_), Some(_)) => {
            return Err("give `norm`, not also the older `layer_norm`".into());
        }
        (Some(norm), None) => norm,
        (None, Some(true) | None) => Norm::Layer,
        (None, Some(false)) => Norm::None,
    };
    let with_activation = |activation: Option<crate::Activation>| match activation {
        Some(crate::Activation::GeluTanh) => Mlp::GeluTanh,
        Some(crate::Activation::Relu2) => Mlp::Relu2,
        Some(crate::Activation::SwiGlu) => Mlp::SwiGlu,
        Some(crate::Activation::Gelu) | None => Mlp::Gelu,
    };
    let mlp = match (mlp, activation) {
        (Some(MlpSetting::Part(_)), Some(_)) => {
            return Err(
                "give `mlp = \"gelu_tanh\"` (or another part), not also the older \
                        `activation`"
                    .into(),
            );
        }
        (Some(MlpSetting::Part(mlp)), None) => mlp,
        // Older run directories wrote `activation` always, and `mlp = false` beside it.
        (Some(MlpSetting::On(false)), _) => Mlp::None,
        (Some(MlpSetting::On(true)) | None, activation) => with_activation(activation),
    };
    Ok((norm, mlp))
}

impl crate::GptConfig {
    /// The parts in words, for a person: `learned positions, LayerNorm, GELU MLP 512 wide`, then
    /// whatever else differs from GPT-2 (grouped heads, QK-norm, a soft-cap, the zero init).
    pub fn parts(&self) -> String {
        let position = match self.position {
            Position::Learned => "learned positions".to_string(),
            Position::Rope => format!("rotary positions (θ {})", self.rope_theta),
            Position::None => "no positions".to_string(),
        };
        let norm = match self.norm {
            Norm::Layer => "LayerNorm",
            Norm::Rms => "RMSNorm",
            Norm::RmsUnit => "RMSNorm without gain",
            Norm::None => "no norm",
        };
        let mlp = match self.mlp {
            Mlp::Gelu => "GELU",
            Mlp::GeluTanh => "tanh-GELU",
            Mlp::Relu2 => "ReLU²",
            Mlp::SwiGlu => "SwiGLU",
            Mlp::None => "",
        };
        let mut parts = vec![position, norm.to_string()];
        parts.push(match self.mlp {
            Mlp::None => "no MLP".to_string(),
            _ => format!("{mlp} MLP {} wide", self.mlp_width()),
        });
        if self.kv_heads() != self.n_head {
            parts.push(format!("{} key/value heads", self.kv_heads()));
        }
        if self.qk_norm {
            parts.push("QK-norm".into());
        }
        if self.logit_softcap > 0.0 {
            parts.push(format!("logits capped at ±{}", self.logit_softcap));
        }
        match self.proj_init {
            ProjInit::Scaled => {}
            ProjInit::Zero => parts.push("zero-initialised projections".into()),
        }
        parts.join(", ")
    }
}
