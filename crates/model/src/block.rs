//! One transformer block: pre-LayerNorm causal self-attention and MLP, each on a residual branch.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Initializer, LayerNorm, LayerNormConfig, Linear};
use burn::tensor::activation::{gelu, gelu_approximate};
use burn::tensor::{Bool, Device, Tensor};
use tinygpt_attention::{CausalSelfAttention, KvCache};

use crate::config::{Activation, GptConfig};
use crate::error::GptConfigError;
use crate::gpu;
use crate::parts::Norm;

/// GPT-2's MLP: `n_embd -> mlp_width` (`4·n_embd`), GELU, `mlp_width -> n_embd`, dropout.
#[derive(Module, Debug)]
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
    pub dropout: Dropout,
    #[module(skip)]
    pub activation: Activation,
}

impl Mlp {
    /// `[batch, seq, n_embd] -> [batch, seq, n_embd]`.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = self.c_fc.forward(x);
        let h = match self.activation {
            Activation::Gelu => gelu(h),
            Activation::GeluTanh => gelu_approximate(h),
        };
        self.dropout.forward(self.c_proj.forward(h))
    }
}

/// `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`. LayerNorms and MLP are optional (see
/// [`GptConfig::minimal`]).
#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: Option<LayerNorm>,
    pub attn: CausalSelfAttention,
    pub ln_2: Option<LayerNorm>,
    pub mlp: Option<Mlp>,
    /// The LayerNorms' ε, copied from the config at init (Burn's `LayerNorm` keeps its own
    /// private, and a block cannot see the model's config): what the fused GPU LayerNorm is
    /// given. Private, so it cannot come to disagree with the config.
    #[module(skip)]
    layer_norm_eps: f64,
}

/// A linear layer with GPT-2's init: weight ~ N(0, std), bias 0.
pub(crate) fn linear(d_in: usize, d_out: usize, std: f64, bias: bool, device: &Device) -> Linear {
    Linear {
        weight: Initializer::Normal { mean: 0.0, std }.init([d_in, d_out], device),
        bias: bias.then(|| Initializer::Zeros.init([d_out], device)),
    }
}

/// The normalisation [`Norm`] asks for, before a sublayer or the head.
pub(crate) fn layer_norm(config: &GptConfig, device: &Device) -> Option<LayerNorm> {
    match config.norm {
        Norm::Layer => Some(
            LayerNormConfig::new(config.n_embd)
                .with_bias(config.bias)
                .with_epsilon(config.layer_norm_eps)
                .init(device),
        ),
        Norm::None => None,
    }
}

impl Block {
    pub(crate) fn init(config: &GptConfig, device: &Device) -> Result<Self, GptConfigError> {
        let (d, hidden) = (config.n_embd, config.mlp_width());
        let attn = config.attention().init(device)?;
        let mlp = config.mlp.activation().map(|activation| Mlp {
            c_fc: linear(d, hidden, 0.02, config.bias, device),
            c_proj: linear(hidden, d, config.residual_init_std(), config.bias, device),
            dropout: DropoutConfig::new(config.dropout).init(),
            activation,
        });
        Ok(Self {
            ln_1: layer_norm(config, device),
            attn,
            ln_2: layer_norm(config, device),
            mlp,
            layer_norm_eps: config.layer_norm_eps,
        })
    }

    /// `[batch, seq, n_embd] -> [batch, seq, n_embd]`; `key_padding` as in
    /// [`CausalSelfAttention::forward`].
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Result<Tensor<3>, tinygpt_attention::AttentionError> {
        let a = self.attn.forward(self.attn_input(x.clone()), key_padding)?;
        Ok(self.feed_forward(residual(x, a)))
    }

    /// Incremental form of [`forward`](Self::forward) (see [`CausalSelfAttention::forward_cached`]).
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, tinygpt_attention::AttentionError> {
        let a = self
            .attn
            .forward_cached(self.attn_input(x.clone()), cache)?;
        Ok(self.feed_forward(residual(x, a)))
    }

    /// Like [`forward`](Self::forward), also returning the attention weights
    /// `[batch, heads, seq, seq]`.
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
    ) -> Result<(Tensor<3>, Tensor<4>), tinygpt_attention::AttentionError> {
        let (a, weights) = self
            .attn
            .forward_with_weights(self.attn_input(x.clone()), None)?;
        Ok((self.feed_forward(residual(x, a)), weights))
    }

    /// `ln_1(x)`, in f32 like the residual stream, then in the attention's dtype.
    fn attn_input(&self, x: Tensor<3>) -> Tensor<3> {
        norm(&self.ln_1, x, self.layer_norm_eps).cast(self.attn.dtype())
    }

    fn feed_forward(&self, x: Tensor<3>) -> Tensor<3> {
        match &self.mlp {
            Some(mlp) => {
                let h = norm(&self.ln_2, x.clone(), self.layer_norm_eps);
                let h = h.cast(mlp.c_fc.weight.dtype());
                residual(x, mlp.forward(h))
            }
            None => x,
        }
    }
}

/// `x + branch`, in the residual stream's dtype. In a mixed-precision step the stream, the
/// LayerNorms and their statistics stay f32 while the branches compute in bf16 or f16
/// (PyTorch autocast's split): every block adds a low-precision update to full-precision sums.
fn residual(x: Tensor<3>, branch: Tensor<3>) -> Tensor<3> {
    let dtype = x.dtype();
    x + branch.cast(dtype)
}

/// `ln(x)` (with ε `epsilon`), by the fused kernel on a GPU; `x` when there is no LayerNorm.
pub(crate) fn norm(ln: &Option<LayerNorm>, x: Tensor<3>, epsilon: f64) -> Tensor<3> {
    match ln {
        Some(ln) if gpu::supported(&x.device(), x.dtype()) => {
            let beta = ln.beta.as_ref().map(|b| b.val());
            gpu::layer_norm(x, ln.gamma.val(), beta, epsilon)
        }
        Some(ln) => ln.forward(x),
        None => x,
    }
}
