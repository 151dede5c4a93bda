//! Configuration of [`CausalSelfAttention`](crate::CausalSelfAttention), with validation; the
//! layer's `init` is beside the layer, in `attention.rs`.

use burn::config::Config;
use serde::{Deserialize, Serialize};

use crate::error::AttentionConfigError;

/// Which implementation computes `softmax(QKᵀ/√d + mask) · V`. In TOML: `"auto"`, `"explicit"`,
/// `"sdpa"`, `"flash"` (`"fused"`, an earlier name, is read as `"sdpa"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// By what a call brings ([`Pass`](crate::Pass), padding): on a training pass on a layer
    /// running [`Kernels::Cube`](crate::Kernels::Cube) (a GPU), [`Flash`](AttentionKernel::Flash);
    /// on an inference pass without padding, [`Sdpa`](AttentionKernel::Sdpa); otherwise
    /// [`Explicit`](AttentionKernel::Explicit).
    Auto,
    /// Scores, mask, softmax, dropout and the weighted sum as separate tensor ops: the code that
    /// teaches, the only one that can return the weights, and on CPU the faster one under
    /// autodiff. Dropout on the weights is applied here and inside [`Flash`](Self::Flash).
    Explicit,
    /// Burn's `burn::tensor::module::attention` with `is_causal: true`; backends may run a
    /// flash-attention kernel. No dropout and no weights; an active dropout falls back to
    /// [`Explicit`](AttentionKernel::Explicit).
    #[serde(alias = "fused")]
    Sdpa,
    /// tinygpt's flash attention ([`crate::flash`]): one CubeCL kernel for the forward and one
    /// hand-written backward, the `[seq, seq]` scores never in memory, dropout inside the kernel.
    /// On a layer running [`Kernels::Cube`](crate::Kernels::Cube) (wgpu, Vulkan, CUDA) in f32
    /// with `d_head <= 256`; elsewhere, and with a padding mask, the explicit path.
    Flash,
}

/// Configuration to create a [`CausalSelfAttention`](crate::CausalSelfAttention) layer with
/// [`init`](Self::init).
#[derive(Config, Debug)]
pub struct CausalSelfAttentionConfig {
    /// Width of the residual stream: input and output size of the layer.
    pub d_model: usize,
    /// Number of heads; each works on `d_model / n_heads` channels, so it must divide `d_model`.
    pub n_heads: usize,
    /// Longest sequence accepted (the model's context, nanoGPT's `block_size`). Longer inputs are
    /// an error, never a silent truncation.
    pub max_seq_len: usize,
    /// Dropout probability on the attention weights and on the output projection (nanoGPT's
    /// `attn_dropout` and `resid_dropout`). Active only in training.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Whether the query/key/value and output projections have a bias.
    #[config(default = true)]
    pub bias: bool,
    /// Standard deviation of the normal init of the q/k/v projection (GPT-2: 0.02). Biases are 0.
    #[config(default = 0.02)]
    pub init_std: f64,
    /// Standard deviation of the output projection's init; GPT-2 scales it by `1/√(2·n_layer)`
    /// because it adds to the residual stream once per block. `None` = `init_std`.
    #[config(default = "None")]
    pub proj_init_std: Option<f64>,
    /// Which attention implementation to use.
    #[config(default = "AttentionKernel::Auto")]
    pub kernel: AttentionKernel,
    /// Key/value heads ([`grouped`](crate::grouped)): `n_heads` query heads share them in
    /// groups of `n_heads / n_kv_heads` (grouped-query attention; 1 = multi-query). `None` =
    /// `n_heads`, ordinary multi-head attention.
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Rotary positions ([`rope`](crate::rope)) with this base θ (10000 in GPT-NeoX and
    /// Llama 2, 100000 in SmolLM2): queries and keys rotated by their position before the
    /// scores. `None` = no positions here (the model adds learned ones to its input, or none).
    #[config(default = "None")]
    pub rope_base: Option<f64>,
    /// QK-norm ([`qk_norm`](crate::qk_norm)) with this ε: each head's queries and keys scaled
    /// to unit RMS (no gain) before the rotation and the scores. `None` = off.
    #[config(default = "None")]
    pub qk_norm_eps: Option<f64>,
}

impl CausalSelfAttentionConfig {
    /// Key/value heads: [`n_kv_heads`](Self::n_kv_heads), or `n_heads` when unset.
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Checks every value; the first problem is returned as a typed error.
    pub fn validate(&self) -> Result<(), AttentionConfigError> {
        for (name, value) in [
            ("d_model", self.d_model),
            ("n_heads", self.n_heads),
            ("max_seq_len", self.max_seq_len),
        ] {
            if value == 0 {
                return Err(AttentionConfigError::Zero { name });
            }
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(AttentionConfigError::HeadsDoNotDivide {
                d_model: self.d_model,
                n_heads: self.n_heads,
            });
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.n_heads.is_multiple_of(kv) {
            return Err(AttentionConfigError::KvHeadsDoNotDivide {
                n_heads: self.n_heads,
                n_kv_heads: kv,
            });
        }
        if let Some(base) = self.rope_base {
            let d_head = self.d_model / self.n_heads;
            if !d_head.is_multiple_of(2) {
                return Err(AttentionConfigError::RopeOddHead { d_head });
            }
            if !(base.is_finite() && base > 0.0) {
                return Err(AttentionConfigError::RopeBase(base));
            }
        }
        if let Some(eps) = self.qk_norm_eps
            && !(eps.is_finite() && eps > 0.0)
        {
            return Err(AttentionConfigError::QkNormEps(eps));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(AttentionConfigError::Dropout(self.dropout));
        }
        for (name, std) in [
            ("init_std", Some(self.init_std)),
            ("proj_init_std", self.proj_init_std),
        ] {
            if let Some(std) = std
                && !(std.is_finite() && std >= 0.0)
            {
                return Err(AttentionConfigError::InitStd { name, value: std });
            }
        }
        Ok(())
    }
}
