//! One transformer block: pre-norm causal self-attention and MLP, each on a residual branch.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::tensor::activation::{gelu, gelu_approximate, relu, silu};
use burn::tensor::{Bool, Device, Tensor};
use tinygpt_attention::lora::project;
use tinygpt_attention::{AttentionKernel, CausalSelfAttention, DecodeProduct, Pass, burn_product};

use super::norm::Normalization;
use crate::arch::{GptConfig, Mlp};
use crate::error::GptConfigError;
use crate::gpu::Kernels;

/// The feed-forward sublayer, whichever [`Mlp`] part the config names: `n_embd -> mlp_width`
/// (`4·n_embd`), the activation, `mlp_width -> n_embd`, dropout (GPT-2's with GELU). SwiGLU's
/// `c_fc` is `n_embd -> 2·mlp_width`, the gate's columns then the up projection's, and
/// `silu(gate) ⊙ up` is what `c_proj` reads.
#[derive(Module, Debug)]
pub struct FeedForward {
    pub c_fc: Linear,
    pub c_proj: Linear,
    pub dropout: Dropout,
    /// Dropout on the inputs of LoRA adapters on `c_fc` and `c_proj` while training (`[lora]
    /// dropout`, [`tinygpt_attention::lora`]); probability 0 without.
    pub adapter_dropout: Dropout,
    /// Which MLP: copied from the config at init, never [`Mlp::None`] (no sublayer is built
    /// then); private, so it cannot come to disagree with the config.
    #[module(skip)]
    kind: Mlp,
    /// How it multiplies by its matrices: Burn's matmul, or on a GPU the rows kernel for a
    /// decode step's few rows (set by the model with its attention's,
    /// [`Gpt::with_kernels`](crate::Gpt::with_kernels)).
    #[module(skip)]
    pub(crate) product: DecodeProduct,
}

impl FeedForward {
    /// The sublayer `config` asks for on `device`; `None` for [`Mlp::None`].
    fn init(config: &GptConfig, device: &Device) -> Option<Self> {
        let (d, hidden) = (config.n_embd, config.mlp_width());
        match config.mlp {
            Mlp::None => None,
            kind @ (Mlp::Gelu | Mlp::GeluTanh | Mlp::Relu2 | Mlp::SwiGlu) => Some(Self {
                c_fc: linear(d, config.fc_width(), 0.02, config.bias, device),
                c_proj: linear(hidden, d, config.residual_init_std(), config.bias, device),
                dropout: DropoutConfig::new(config.dropout).init(),
                adapter_dropout: DropoutConfig::new(0.0).init(),
                kind,
                product: burn_product,
            }),
        }
    }

    /// `[batch, seq, n_embd] -> [batch, seq, n_embd]`, dropping out on a training `pass`.
    pub fn forward(&self, x: Tensor<3>, pass: Pass) -> Tensor<3> {
        let h = self.product(&self.c_fc, x, pass);
        let h = match self.kind {
            Mlp::Gelu => gelu(h),
            Mlp::GeluTanh => gelu_approximate(h),
            Mlp::Relu2 => relu(h).square(),
            Mlp::SwiGlu => {
                let hidden = h.dims()[2] / 2;
                let gate = h.clone().narrow(2, 0, hidden);
                silu(gate) * h.narrow(2, hidden, hidden)
            }
            Mlp::None => unreachable!("no FeedForward is built for mlp = \"none\""),
        };
        pass.dropout(&self.dropout, self.product(&self.c_proj, h, pass))
    }

    /// `x·W + b` by the layer's product; on a training pass, with its adapters' inputs dropped
    /// out where `[lora] dropout` asks ([`project`]).
    fn product(&self, layer: &Linear, x: Tensor<3>, pass: Pass) -> Tensor<3> {
        match pass.drops(&self.adapter_dropout) {
            true => project(layer, x, &self.adapter_dropout, pass),
            false => (self.product)(layer, x),
        }
    }
}

/// `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`. The norms and the MLP are optional (see
/// [`GptConfig::minimal`]).
#[derive(Module, Debug)]
pub struct Block {
    /// The norm before attention (`None`: `norm = "none"`).
    pub ln_1: Option<Normalization>,
    pub attn: CausalSelfAttention,
    /// The norm before the MLP.
    pub ln_2: Option<Normalization>,
    /// The feed-forward sublayer (`None`: `mlp = "none"`).
    pub mlp: Option<FeedForward>,
}

/// A linear layer with GPT-2's init: weight ~ N(0, std) (all zeros for std 0), bias 0.
pub(crate) fn linear(d_in: usize, d_out: usize, std: f64, bias: bool, device: &Device) -> Linear {
    let weight = match std {
        0.0 => Initializer::Zeros,
        std => Initializer::Normal { mean: 0.0, std },
    };
    Linear {
        weight: weight.init([d_in, d_out], device),
        bias: bias.then(|| Initializer::Zeros.init([d_out], device)),
    }
}

impl Block {
    pub(crate) fn init(
        config: &GptConfig,
        device: &Device,
        kernels: Kernels,
        kernel: AttentionKernel,
    ) -> Result<Self, GptConfigError> {
        let attn = config.attention().with_kernel(kernel).init(device)?;
        Ok(Self {
            ln_1: Normalization::init(config, device, kernels),
            attn,
            ln_2: Normalization::init(config, device, kernels),
            mlp: FeedForward::init(config, device),
        })
    }

    /// `[batch, seq, n_embd] -> [batch, seq, n_embd]`; `key_padding` and `pass` as in
    /// [`CausalSelfAttention::forward`].
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        pass: Pass,
    ) -> Result<Tensor<3>, tinygpt_attention::AttentionError> {
        let a = self
            .attn
            .forward(self.attn_input(x.clone()), key_padding, pass)?;
        Ok(self.feed_forward(residual(x, a), pass))
    }

    /// Like [`forward`](Self::forward) on an inference pass, also returning the attention
    /// weights `[batch, heads, seq, seq]`.
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
    ) -> Result<(Tensor<3>, Tensor<4>), tinygpt_attention::AttentionError> {
        let (a, weights) =
            self.attn
                .forward_with_weights(self.attn_input(x.clone()), None, Pass::Infer)?;
        Ok((self.feed_forward(residual(x, a), Pass::Infer), weights))
    }

    /// `ln_1(x)`, in f32 like the residual stream, then in the attention's dtype.
    pub(crate) fn attn_input(&self, x: Tensor<3>) -> Tensor<3> {
        norm(&self.ln_1, x).cast(self.attn.dtype())
    }

    pub(crate) fn feed_forward(&self, x: Tensor<3>, pass: Pass) -> Tensor<3> {
        match &self.mlp {
            Some(mlp) => {
                let h = norm(&self.ln_2, x.clone());
                let h = h.cast(mlp.c_fc.weight.dtype());
                residual(x, mlp.forward(h, pass))
            }
            None => x,
        }
    }
}

/// `x + branch`, in the residual stream's dtype. In a mixed-precision step the stream, the
/// LayerNorms and their statistics stay f32 while the branches compute in bf16 or f16
/// (PyTorch autocast's split): every block adds a low-precision update to full-precision sums.
pub(crate) fn residual(x: Tensor<3>, branch: Tensor<3>) -> Tensor<3> {
    let dtype = x.dtype();
    x + branch.cast(dtype)
}

/// `norm(x)`, or `x` when there is no norm.
pub(crate) fn norm(norm: &Option<Normalization>, x: Tensor<3>) -> Tensor<3> {
    match norm {
        Some(norm) => norm.forward(x),
        None => x,
    }
}
