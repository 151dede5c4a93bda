//! [`GptConfig`]: the architecture, its presets and its validation.

use burn::config::Config;
use burn::tensor::Device;
use tinygpt_attention::AttentionKernel;

use crate::error::GptConfigError;
use crate::gpt::Gpt;

/// The architecture of a [`Gpt`]. Field names follow nanoGPT's `GPTConfig`.
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Number of distinct tokens (the tokenizer's vocabulary).
    pub vocab_size: usize,
    /// Context length: the most tokens the model sees at once.
    #[config(default = 64)]
    pub block_size: usize,
    /// Number of transformer blocks.
    #[config(default = 4)]
    pub n_layer: usize,
    /// Attention heads per block; must divide `n_embd`.
    #[config(default = 4)]
    pub n_head: usize,
    /// Width of the residual stream.
    #[config(default = 128)]
    pub n_embd: usize,
    /// Dropout after the embeddings, on attention weights and on each residual branch.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Biases in the linear layers and LayerNorms (GPT-2: yes; nanoGPT's 10.65M config: no).
    #[config(default = true)]
    pub bias: bool,
    /// Share the token embedding matrix with the LM head (GPT-2 and nanoGPT do).
    #[config(default = true)]
    pub tie_embeddings: bool,
    /// Each block has a GELU MLP after attention. Off in [`GptConfig::minimal`].
    #[config(default = true)]
    pub mlp: bool,
    /// Pre-LayerNorm in each block and before the head. Off in [`GptConfig::minimal`].
    #[config(default = true)]
    pub layer_norm: bool,
    /// The MLP's nonlinearity: exact GELU (nanoGPT) or GPT-2's tanh approximation.
    #[config(default = "Activation::Gelu")]
    pub activation: Activation,
    /// LayerNorm's ε (PyTorch's default, which nanoGPT uses; GPT-2's `layer_norm_epsilon`).
    #[config(default = 1e-5)]
    pub layer_norm_eps: f64,
    /// Attention implementation (see [`AttentionKernel`]).
    #[config(default = "AttentionKernel::Auto")]
    pub kernel: AttentionKernel,
}

/// The nonlinearity between the MLP's two linear layers.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x·Φ(x)`, Φ the normal CDF through `erf` (PyTorch's `F.gelu`, nanoGPT).
    Gelu,
    /// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))`: GPT-2's `gelu_new`, Hugging Face checkpoints.
    GeluTanh,
}

impl GptConfig {
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

    /// The bare model of the attention lessons: token + position embedding, one single-head causal attention
    /// (with its residual connection), a linear head; no MLP, no LayerNorm, untied head.
    pub fn minimal(vocab_size: usize) -> Self {
        Self::new(vocab_size)
            .with_n_layer(1)
            .with_n_head(1)
            .with_n_embd(64)
            .with_block_size(32)
            .with_mlp(false)
            .with_layer_norm(false)
            .with_tie_embeddings(false)
    }

    /// Checks every value; the error names the offending key.
    pub fn validate(&self) -> Result<(), GptConfigError> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ] {
            if value == 0 {
                return Err(GptConfigError::Zero { name });
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(GptConfigError::HeadsDoNotDivide {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(GptConfigError::Dropout(self.dropout));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(GptConfigError::LayerNormEps(self.layer_norm_eps));
        }
        Ok(())
    }

    /// How many parameters a model of this config has, computed without building it (what
    /// [`Gpt::num_params`](crate::Gpt::num_params) counts once built); saturates instead of overflowing.
    pub fn num_params(&self) -> u64 {
        // f64 counts exactly up to 2^53 parameters; `as u64` saturates beyond u64.
        let n = |x: usize| x as f64;
        let (v, t, c) = (n(self.vocab_size), n(self.block_size), n(self.n_embd));
        let b = f64::from(u8::from(self.bias));
        let linear = |d_in: f64, d_out: f64| d_in * d_out + b * d_out;
        let ln = if self.layer_norm { c + b * c } else { 0.0 };
        let mlp = if self.mlp {
            linear(c, 4.0 * c) + linear(4.0 * c, c)
        } else {
            0.0
        };
        let block = 2.0 * ln + linear(c, 3.0 * c) + linear(c, c) + mlp;
        let head = if self.tie_embeddings { 0.0 } else { c * v };
        (v * c + t * c + n(self.n_layer) * block + ln + head) as u64
    }

    /// Validates the config and creates the model on `device` with GPT-2's initialisation.
    pub fn init(&self, device: &Device) -> Result<Gpt, GptConfigError> {
        self.validate()?;
        Gpt::init(self, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_parameters_equal_the_built_model_s() {
        let configs = [
            GptConfig::baby(65),
            GptConfig::baby(50)
                .with_bias(false)
                .with_tie_embeddings(false),
            GptConfig::new(11)
                .with_n_layer(3)
                .with_n_embd(24)
                .with_n_head(3),
            GptConfig::minimal(65),
        ];
        for config in configs {
            let model = config.init(&Device::flex()).unwrap();
            assert_eq!(config.num_params(), model.num_params() as u64, "{config:?}");
        }
    }

    #[test]
    fn counting_an_absurd_config_does_not_overflow() {
        let config = GptConfig::new(usize::MAX).with_n_embd(usize::MAX);
        assert_eq!(config.num_params(), u64::MAX);
    }
}
