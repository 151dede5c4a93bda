//! The architecture's variable parts, each an enum whose variants are the choices a model can
//! make, documented with the formula and who uses it.
//!
//! Every place that depends on a part (the Burn modules, the parameter table and count, the
//! fused CPU engine's allow-list, the memory estimate, each import and export format) decides
//! on it with a `match` that has no catch-all arm, so the compiler names each place a new
//! variant must visit before the variant builds.
//!
//! Each part's `all()` gives every variant (derived, so it cannot miss one): the tests that
//! check each choice loop over it, and a new variant is tested by every loop that tests its
//! siblings.
//!
//! In TOML they are `model.position`, `model.norm` and `model.mlp`; configs written before the
//! parts existed still read ([`legacy`](super::legacy)).

use serde::{Deserialize, Serialize};
use strum::{EnumIter, IntoEnumIterator};

/// Where a token's position enters the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, EnumIter)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, EnumIter)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, EnumIter)]
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

/// How the projections onto the residual stream (attention's and the MLP's `c_proj`) start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, EnumIter)]
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

/// `all()`: every variant of a part, in declaration order.
macro_rules! every_variant {
    ($($part:ty),*) => {
        $(
            impl $part {
                /// Every variant, in declaration order (derived: a new one is in it).
                pub fn all() -> impl Iterator<Item = Self> + Clone {
                    <Self as IntoEnumIterator>::iter()
                }
            }
        )*
    };
}

every_variant!(Position, Norm, Mlp, ProjInit);
