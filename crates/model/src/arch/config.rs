//! [`GptConfig`]: the architecture, written once. It is the `[model]` section of a run's
//! config, what imports build from nanoGPT's `model_args` and GPT-2's `config.json`, what the
//! parameter count and memory estimates read, and what the attention layer's config is derived
//! from. Sizes derived from it ([`GptConfig::head_size`], [`GptConfig::mlp_width`]) are methods
//! here and nowhere else.

use serde::{Deserialize, Serialize};
use tinygpt_attention::{AttentionConfigError, CausalSelfAttentionConfig};

use super::legacy::{self, MlpSetting};
use super::parts::{Mlp, Norm, Position, ProjInit};
use crate::error::GptConfigError;

/// The architecture of a [`Gpt`](crate::Gpt): its sizes and its parts ([`crate::parts`]). Field
/// names follow nanoGPT's `GPTConfig`; the defaults are nanoGPT's CPU "baby" model. Unknown
/// keys are errors when read from TOML; the spellings from before the parts still read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "GptConfigToml")]
pub struct GptConfig {
    /// Context length: the most tokens the model sees at once. Default 64.
    pub block_size: usize,
    /// Number of transformer blocks. Default 4.
    pub n_layer: usize,
    /// Attention heads per block; must divide `n_embd`. Default 4.
    pub n_head: usize,
    /// Width of the residual stream. Default 128.
    pub n_embd: usize,
    /// Dropout after the embeddings, on attention weights and on each residual branch.
    /// Default 0.
    pub dropout: f64,
    /// Biases in the linear layers and LayerNorms (GPT-2: yes; nanoGPT's 10.65M config: no).
    /// Default true.
    pub bias: bool,
    /// Share the token embedding matrix with the LM head (GPT-2 and nanoGPT do). Default true.
    pub tie_embeddings: bool,
    /// Where positions enter the model. Default `learned`.
    pub position: Position,
    /// The normalisation before each sublayer and the head. Default `layer`.
    pub norm: Norm,
    /// The feed-forward sublayer of each block. Default `gelu`.
    pub mlp: Mlp,
    /// The normalisation's ε (PyTorch's LayerNorm default, which nanoGPT uses; GPT-2's
    /// `layer_norm_epsilon`). Default 1e-5.
    pub layer_norm_eps: f64,
    /// Rows of the token embedding and the LM head. 0 (the default, left out of TOML) = the
    /// tokenizer's vocabulary, filled in by [`GptConfig::for_vocabulary`]; larger pads it, as
    /// nanoGPT pads GPT-2's 50257 to 50304 (padding ids are never sampled).
    #[serde(skip_serializing_if = "is_zero")]
    pub vocab_size: usize,
    /// Soft-cap of the logits (Gemma 2, nanochat: 15): `cap · tanh(logits / cap)`, so no logit
    /// passes `±cap` and the softmax cannot saturate; 0 (the default) = none.
    pub logit_softcap: f64,
    /// Rotary positions' base θ, read with `position = "rope"`. Default 10000 (GPT-NeoX,
    /// Llama 2, nanochat).
    pub rope_theta: f64,
    /// Key/value heads (grouped-query attention; 1 = multi-query); must divide `n_head`.
    /// Unset (the default, left out of TOML) = `n_head`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_kv_head: Option<usize>,
    /// QK-norm: each head's queries and keys scaled to unit RMS (no gain, ε `layer_norm_eps`)
    /// before the scores (nanochat, OLMo 2). Default false.
    pub qk_norm: bool,
    /// The MLP's hidden width. Unset (the default, left out of TOML) = `4·n_embd`, or for
    /// `swiglu` `8·n_embd/3` rounded up to a multiple of 64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mlp_hidden: Option<usize>,
    /// How the projections onto the residual stream start: `scaled` (GPT-2's, the default)
    /// or `zero`.
    pub proj_init: ProjInit,
    /// An exact bigram embedding (modded-nanogpt's bigram table, unhashed): a learned row for
    /// each pair of a token and the one before it, `[(vocab_size + 1)·vocab_size, n_embd]`,
    /// added to the token's embedding; the first token of a context pairs with "none" (the
    /// last `vocab_size` rows). Rows start at zero. For small vocabularies (characters: 70
    /// tokens make 4,970 rows); at most [`BIGRAM_VOCAB`] tokens. Default false.
    pub bigram: bool,
}

/// The largest vocabulary a [`GptConfig::bigram`] table is made for: 1,025 × 1,024 rows.
pub const BIGRAM_VOCAB: usize = 1024;

/// `[model]` as a file may spell it: the parts, or the settings from before them
/// (`layer_norm`, `mlp = true | false`, `activation`), resolved by [`legacy`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GptConfigToml {
    block_size: Option<usize>,
    n_layer: Option<usize>,
    n_head: Option<usize>,
    n_embd: Option<usize>,
    dropout: Option<f64>,
    bias: Option<bool>,
    tie_embeddings: Option<bool>,
    position: Option<Position>,
    norm: Option<Norm>,
    mlp: Option<MlpSetting>,
    layer_norm_eps: Option<f64>,
    vocab_size: Option<usize>,
    logit_softcap: Option<f64>,
    rope_theta: Option<f64>,
    n_kv_head: Option<usize>,
    qk_norm: Option<bool>,
    mlp_hidden: Option<usize>,
    proj_init: Option<ProjInit>,
    bigram: Option<bool>,
    layer_norm: Option<bool>,
    activation: Option<Mlp>,
}

impl TryFrom<GptConfigToml> for GptConfig {
    type Error = String;

    fn try_from(t: GptConfigToml) -> Result<Self, String> {
        let d = GptConfig::default();
        let (norm, mlp) = legacy::resolve(t.norm, t.layer_norm, t.mlp, t.activation)?;
        Ok(Self {
            block_size: t.block_size.unwrap_or(d.block_size),
            n_layer: t.n_layer.unwrap_or(d.n_layer),
            n_head: t.n_head.unwrap_or(d.n_head),
            n_embd: t.n_embd.unwrap_or(d.n_embd),
            dropout: t.dropout.unwrap_or(d.dropout),
            bias: t.bias.unwrap_or(d.bias),
            tie_embeddings: t.tie_embeddings.unwrap_or(d.tie_embeddings),
            position: t.position.unwrap_or(d.position),
            norm,
            mlp,
            layer_norm_eps: t.layer_norm_eps.unwrap_or(d.layer_norm_eps),
            vocab_size: t.vocab_size.unwrap_or(d.vocab_size),
            logit_softcap: t.logit_softcap.unwrap_or(d.logit_softcap),
            rope_theta: t.rope_theta.unwrap_or(d.rope_theta),
            n_kv_head: t.n_kv_head,
            qk_norm: t.qk_norm.unwrap_or(d.qk_norm),
            mlp_hidden: t.mlp_hidden,
            proj_init: t.proj_init.unwrap_or(d.proj_init),
            bigram: t.bigram.unwrap_or(d.bigram),
        })
    }
}

impl Default for GptConfig {
    fn default() -> Self {
        Self {
            block_size: 64,
            n_layer: 4,
            n_head: 4,
            n_embd: 128,
            dropout: 0.0,
            bias: true,
            tie_embeddings: true,
            position: Position::Learned,
            norm: Norm::Layer,
            mlp: Mlp::Gelu,
            layer_norm_eps: 1e-5,
            vocab_size: 0,
            logit_softcap: 0.0,
            rope_theta: 10_000.0,
            n_kv_head: None,
            qk_norm: false,
            mlp_hidden: None,
            proj_init: ProjInit::Scaled,
            bigram: false,
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `with_<field>(value)` builders, Burn's `Config` style.
macro_rules! builders {
    ($($with:ident => $field:ident: $ty:ty),* $(,)?) => {
        $(
            #[doc = concat!("This config with `", stringify!($field), "` set.")]
            pub fn $with(mut self, $field: $ty) -> Self {
                self.$field = $field;
                self
            }
        )*
    };
}

impl GptConfig {
    /// The defaults, with a vocabulary of `vocab_size` tokens.
    pub fn new(vocab_size: usize) -> Self {
        Self {
            vocab_size,
            ..Self::default()
        }
    }

    builders! {
        with_block_size => block_size: usize,
        with_n_layer => n_layer: usize,
        with_n_head => n_head: usize,
        with_n_embd => n_embd: usize,
        with_dropout => dropout: f64,
        with_bias => bias: bool,
        with_tie_embeddings => tie_embeddings: bool,
        with_position => position: Position,
        with_norm => norm: Norm,
        with_mlp => mlp: Mlp,
        with_layer_norm_eps => layer_norm_eps: f64,
        with_vocab_size => vocab_size: usize,
        with_logit_softcap => logit_softcap: f64,
        with_rope_theta => rope_theta: f64,
        with_n_kv_head => n_kv_head: Option<usize>,
        with_qk_norm => qk_norm: bool,
        with_mlp_hidden => mlp_hidden: Option<usize>,
        with_proj_init => proj_init: ProjInit,
        with_bigram => bigram: bool,
    }

    /// nanoGPT's CPU "baby" model: 4 layers, 4 heads, `n_embd` 128, block 64, no dropout
    /// (0.80M parameters for a 65-character vocabulary).
    pub fn baby(vocab_size: usize) -> Self {
        Self::new(vocab_size)
    }

    /// nanoGPT's `train_shakespeare_char` model: 6 layers, 6 heads, `n_embd` 384, block 256,
    /// dropout 0.2, no biases (10.65M parameters for 65 characters).
    pub fn shakespeare_char(vocab_size: usize) -> Self {
        Self::new(vocab_size)
            .with_block_size(256)
            .with_n_layer(6)
            .with_n_head(6)
            .with_n_embd(384)
            .with_dropout(0.2)
            .with_bias(false)
    }

    /// The baby model's sizes (4 layers, 4 heads, `n_embd` 128, block 64) with nanochat's parts:
    /// rotary positions, parameter-free RMSNorm, QK-norm, the ReLU² MLP, no biases, an untied
    /// head, logits soft-capped at 15 and zero-initialised output projections.
    pub fn modern(vocab_size: usize) -> Self {
        Self::new(vocab_size)
            .with_position(Position::Rope)
            .with_norm(Norm::RmsUnit)
            .with_qk_norm(true)
            .with_mlp(Mlp::Relu2)
            .with_bias(false)
            .with_tie_embeddings(false)
            .with_logit_softcap(15.0)
            .with_proj_init(ProjInit::Zero)
    }

    /// The bare model of the attention lessons: token + position embedding, one single-head
    /// causal attention (with its residual connection), a linear head; no MLP, no LayerNorm,
    /// untied head.
    pub fn minimal(vocab_size: usize) -> Self {
        Self::new(vocab_size)
            .with_n_layer(1)
            .with_n_head(1)
            .with_n_embd(64)
            .with_block_size(32)
            .with_mlp(Mlp::None)
            .with_norm(Norm::None)
            .with_tie_embeddings(false)
    }

    /// This architecture for a tokenizer of `tokens` ids: `vocab_size` 0 becomes `tokens`; a
    /// set `vocab_size` (a padded vocabulary) stays. See
    /// [`check_vocabulary`](Self::check_vocabulary).
    pub fn for_vocabulary(&self, tokens: usize) -> Self {
        match self.vocab_size {
            0 => self.clone().with_vocab_size(tokens),
            _ => self.clone(),
        }
    }

    /// Whether a tokenizer of `tokens` ids fits: a set `vocab_size` must hold them all, and a
    /// bigram table ([`bigram`](Self::bigram)) is made for at most [`BIGRAM_VOCAB`] tokens.
    pub fn check_vocabulary(&self, tokens: usize) -> Result<(), GptConfigError> {
        match self.vocab_size {
            rows if rows != 0 && rows < tokens => {
                Err(GptConfigError::VocabularyTooSmall { rows, tokens })
            }
            rows => self.check_bigram(rows.max(tokens)),
        }
    }

    /// Rows of the bigram table ([`bigram`](Self::bigram)): `(vocab_size + 1)·vocab_size`,
    /// the pairs of a token with each token before it and with none; 0 without it.
    pub fn bigram_rows(&self) -> usize {
        match self.bigram {
            true => self
                .vocab_size
                .saturating_add(1)
                .saturating_mul(self.vocab_size),
            false => 0,
        }
    }

    /// The bigram table's row for `token` after `before` (`None`: the first of a context).
    pub fn bigram_pair(&self, before: Option<usize>, token: usize) -> usize {
        before.unwrap_or(self.vocab_size) * self.vocab_size + token
    }

    fn check_bigram(&self, vocab: usize) -> Result<(), GptConfigError> {
        match self.bigram && vocab > BIGRAM_VOCAB {
            true => Err(GptConfigError::BigramVocabulary { vocab }),
            false => Ok(()),
        }
    }

    /// Channels per attention head: `n_embd / n_head`.
    pub fn head_size(&self) -> usize {
        self.n_embd / self.n_head.max(1)
    }

    /// Width of the MLP's hidden layer (each of SwiGLU's two halves): `mlp_hidden`, else
    /// `4·n_embd` (GPT-2's `n_inner`) or for SwiGLU `8·n_embd/3` rounded up to a multiple of
    /// 64; 0 without an MLP.
    pub fn mlp_width(&self) -> usize {
        let default = match self.mlp {
            Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 => self.n_embd.saturating_mul(4),
            Mlp::SwiGlu => self
                .n_embd
                .saturating_mul(8)
                .div_ceil(3 * 64)
                .saturating_mul(64),
            Mlp::None => return 0,
        };
        self.mlp_hidden.unwrap_or(default)
    }

    /// Columns of the MLP's first projection `c_fc`: twice [`mlp_width`](Self::mlp_width) for
    /// SwiGLU (its gate and up projections side by side), else `mlp_width`.
    pub fn fc_width(&self) -> usize {
        let hidden = self.mlp_width();
        match self.mlp {
            Mlp::SwiGlu => hidden.saturating_mul(2),
            Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::None => hidden,
        }
    }

    /// Key/value heads: `n_kv_head`, or `n_head` when unset.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_head.unwrap_or(self.n_head)
    }

    /// Bytes of one sequence's KV cache at full length: keys and values of `kv_heads` heads in
    /// every block, `block_size` tokens, `value_bytes` each (4 in f32, 2 in bf16): what a
    /// decoder holds per stream.
    pub fn kv_cache_bytes(&self, value_bytes: usize) -> usize {
        let per_token = 2 * self.n_layer * self.kv_heads() * self.head_size();
        per_token * self.block_size * value_bytes
    }

    /// Columns of the packed query/key/value projection: `(n_head + 2·kv_heads)·head_size`
    /// (`3·n_embd` without grouped heads).
    pub fn qkv_width(&self) -> usize {
        (self
            .n_head
            .saturating_add(self.kv_heads().saturating_mul(2)))
        .saturating_mul(self.head_size())
    }

    /// The attention layer of every block: `n_embd` wide, `n_head` query and `kv_heads` key/value
    /// heads, `block_size` long, rotary positions and QK-norm as the parts say, the output
    /// projection initialised by [`residual_init_std`](Self::residual_init_std).
    pub fn attention(&self) -> CausalSelfAttentionConfig {
        let rope = match self.position {
            Position::Rope => Some(self.rope_theta),
            Position::Learned | Position::None => None,
        };
        CausalSelfAttentionConfig::new(self.n_embd, self.n_head, self.block_size)
            .with_dropout(self.dropout)
            .with_bias(self.bias)
            .with_init_std(0.02)
            .with_proj_init_std(Some(self.residual_init_std()))
            .with_n_kv_heads(self.n_kv_head)
            .with_rope_base(rope)
            .with_qk_norm_eps(self.qk_norm.then_some(self.layer_norm_eps))
    }

    /// The init standard deviation of the projections onto the residual stream (attention's
    /// and the MLP's `c_proj`): GPT-2's `0.02/√(2·n_layer)`, or 0 for `proj_init = "zero"`.
    pub fn residual_init_std(&self) -> f64 {
        match self.proj_init {
            ProjInit::Scaled => 0.02 / (2.0 * self.n_layer as f64).sqrt(),
            ProjInit::Zero => 0.0,
        }
    }

    /// Checks every value; the error names the offending key. The attention layer's rules
    /// (sizes, heads dividing the width, dropout) are its own config's, checked once there and
    /// named here by this config's keys. `vocab_size` may be 0 (the tokenizer's, not known yet);
    /// [`GptConfig::init`] needs it set.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        if self.n_layer == 0 {
            return Err(GptConfigError::Zero { name: "n_layer" });
        }
        self.attention().validate().map_err(attention_error)?;
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(GptConfigError::LayerNormEps(self.layer_norm_eps));
        }
        if !(self.logit_softcap.is_finite() && self.logit_softcap >= 0.0) {
            return Err(GptConfigError::LogitSoftcap(self.logit_softcap));
        }
        if self.mlp_hidden == Some(0) {
            return Err(GptConfigError::Zero { name: "mlp_hidden" });
        }
        self.check_bigram(self.vocab_size)
    }
}

impl GptConfig {
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
        if self.bigram {
            parts.push("a bigram embedding".into());
        }
        parts.join(", ")
    }
}

/// The attention layer's config error under this config's keys (`n_embd`, not `d_model`).
fn attention_error(e: AttentionConfigError) -> GptConfigError {
    match e {
        AttentionConfigError::Zero { name } => GptConfigError::Zero {
            name: match name {
                "d_model" => "n_embd",
                "n_heads" => "n_head",
                "max_seq_len" => "block_size",
                other => other,
            },
        },
        AttentionConfigError::HeadsDoNotDivide { d_model, n_heads } => {
            GptConfigError::HeadsDoNotDivide {
                n_embd: d_model,
                n_head: n_heads,
            }
        }
        AttentionConfigError::Dropout(p) => GptConfigError::Dropout(p),
        AttentionConfigError::KvHeadsDoNotDivide {
            n_heads,
            n_kv_heads,
        } => GptConfigError::KvHeadsDoNotDivide {
            n_head: n_heads,
            n_kv_head: n_kv_heads,
        },
        AttentionConfigError::RopeBase(theta) => GptConfigError::RopeTheta(theta),
        AttentionConfigError::QkNormEps(eps) => GptConfigError::LayerNormEps(eps),
        other => GptConfigError::Attention(other),
    }
}

#[cfg(test)]
mod tests;
