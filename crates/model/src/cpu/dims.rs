//! [`Dims`]: what the fused CPU engine's kernels are told of a model, read from its config, and
//! the one place that says which configs the engine implements.

use super::error::FusedError;
use crate::arch::{GptConfig, Mlp, Norm, Position};
use crate::nn::Gpt;

/// The model's sizes, read from its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dims {
    pub vocab: usize,
    pub block_size: usize,
    pub width: usize,
    pub heads: usize,
    /// Key/value heads (`heads` without grouped-query attention).
    pub kv_heads: usize,
    /// The MLP's hidden width, and the columns of its first projection (`2·hidden` for
    /// SwiGLU's gate and up).
    pub hidden: usize,
    pub fc_width: usize,
    pub dropout: f32,
    /// The norms' ε, `layer_norm_eps` in f32 (the kernels' precision).
    pub epsilon: f32,
    /// The parts the kernels pick between (each implemented: see `implemented`).
    pub norm: Norm,
    /// The MLP part (its activation, or none: the blocks have no MLP).
    pub mlp: Mlp,
    pub qk_norm: bool,
    /// Rotary positions' base, with `position = "rope"`.
    pub rope: Option<f64>,
    /// The logits' soft-cap; 0 = none.
    pub softcap: f32,
    /// Whether the model has a bigram table ([`GptConfig::bigram`]).
    pub bigram: bool,
}

impl Dims {
    pub fn d_head(&self) -> usize {
        self.width / self.heads
    }

    /// Columns of the packed projection: `heads` query, `kv_heads` key, `kv_heads` value heads.
    pub fn qkv_width(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.d_head()
    }

    /// Columns of the queries and keys together: what QK-norm and the rotation touch.
    pub fn qk_width(&self) -> usize {
        (self.heads + self.kv_heads) * self.d_head()
    }

    /// Columns of the keys (or of the values).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.d_head()
    }

    /// The bigram table's row of `token` after `before` (`None`: the first of a context), as
    /// [`GptConfig::bigram_pair`]; 0, unread, without a table.
    pub fn pair(&self, before: Option<usize>, token: usize) -> usize {
        match self.bigram {
            true => before.unwrap_or(self.vocab) * self.vocab + token,
            false => 0,
        }
    }
}

impl Dims {
    pub fn of(gpt: &Gpt) -> Result<Self, FusedError> {
        implemented(gpt.config());
        gpt.check_config()?;
        Ok(Self::from_config(gpt.config()))
    }

    /// The sizes and parts of a model of `config` (unchecked: [`Dims::of`] checks a model).
    pub fn from_config(config: &GptConfig) -> Self {
        Self {
            vocab: config.vocab_size,
            block_size: config.block_size,
            width: config.n_embd,
            heads: config.n_head,
            kv_heads: config.kv_heads(),
            hidden: config.mlp_width(),
            fc_width: config.fc_width(),
            dropout: config.dropout as f32,
            epsilon: config.layer_norm_eps as f32,
            norm: config.norm,
            mlp: config.mlp,
            qk_norm: config.qk_norm,
            rope: match config.position {
                Position::Rope => Some(config.rope_theta),
                Position::Learned | Position::None => None,
            },
            softcap: config.logit_softcap as f32,
            bigram: config.bigram,
        }
    }
}

/// What the fused engine implements of a [`GptConfig`]: everything [`Gpt`] computes, written
/// as a destructuring of every field and a `match` on every part, so that a field added to
/// [`GptConfig`], or a variant added to a part, does not compile here until someone places it.
/// Today the kernels implement every part (each with a gradient-equality test in
/// `tests/fused_cpu.rs`), so nothing is refused; a part they do not implement would make this
/// return an error for [`Dims::of`] to pass on, and the trainer train it on flex. The sizes,
/// dropout, biases, tying and the norm's ε may take any value. (How Burn computes attention,
/// [`GptConfig::init_with_attention`], is not the model's: the engine has its own attention.)
fn implemented(config: &GptConfig) {
    let GptConfig {
        vocab_size: _,
        block_size: _,
        n_layer: _,
        n_head: _,
        n_embd: _,
        dropout: _,
        bias: _,
        tie_embeddings: _,
        position,
        norm,
        mlp,
        layer_norm_eps: _,
        // The hidden width is a size, and the init is not computed here.
        mlp_hidden: _,
        proj_init: _,
        rope_theta: _,
        // `attention.rs` and the decoder read each query head's key/value head in place.
        n_kv_head: _,
        // Each has its kernels: `qk_norm.rs`, `softcap.rs`.
        qk_norm: _,
        logit_softcap: _,
        // `Params::embed` adds the pair's row; the backward adds to it (`workspace.rs`); the
        // decoders keep each stream's last token for the next pair.
        bigram: _,
    } = config;
    match position {
        // `embed` reads the table when there is one; `rope.rs` rotates queries and keys.
        Position::Learned | Position::Rope | Position::None => {}
    }
    match norm {
        // `layer_norm.rs`, `rms_norm.rs`, and the identity (`norm.rs`).
        Norm::Layer | Norm::Rms | Norm::RmsUnit | Norm::None => {}
    }
    match mlp {
        // `gelu.rs`, `gelu_tanh.rs`, `relu2.rs`, `swiglu.rs`; with none, the block adds nothing
        // after attention (`block.rs`).
        Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu | Mlp::None => {}
    }
}
