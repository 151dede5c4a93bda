//! The layer: causal multi-head self-attention.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, FloatDType, Tensor};

use crate::config::{AttentionKernel, CausalSelfAttentionConfig};
use crate::error::{AttentionConfigError, AttentionError};
use crate::flash::{self, flash_attention_packed};
use crate::grouped::repeat_kv;
use crate::kernels::{DecodeProduct, Kernels, burn_product};
use crate::lora::project;
use crate::mask::{causal_mask_with_offset, mask_then_softmax};
use crate::packed_qk::{self, QkPrep};
use crate::pass::Pass;
use crate::qk_norm::rms_norm_heads;
use crate::rope::RopeRows;
use crate::step::StepAt;

/// Masked (causal) multi-head self-attention, nanoGPT's `CausalSelfAttention`.
///
/// Each position projects to a query, a key and a value. Every head scores each query against
/// every key (`q·k / √d_head`: the scale keeps the scores' variance near 1 so the softmax does
/// not saturate), hides the future with the causal mask, turns scores into weights with a
/// softmax, and returns the weighted sum of the values. The heads' outputs are concatenated and
/// projected back to `d_model`.
///
/// Create it with [`CausalSelfAttentionConfig`](crate::CausalSelfAttentionConfig).
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// Query, key and value projections as one matrix `[d_model, (n_heads + 2·n_kv_heads)·d_head]`
    /// (columns q | k | v; `[d_model, 3·d_model]` without grouped heads), one matmul instead of
    /// three; nanoGPT's `c_attn`.
    pub c_attn: Linear,
    /// Output projection `[d_model, d_model]`; nanoGPT's `c_proj`.
    pub c_proj: Linear,
    /// Dropout on the attention weights: during training each query randomly ignores some keys
    /// (kept weights scaled by `1/(1-p)`), so no head leans on a single position.
    pub attn_dropout: Dropout,
    /// Dropout on the layer's output before it joins the residual stream.
    pub resid_dropout: Dropout,
    /// Dropout on the inputs of LoRA adapters attached to `c_attn` and `c_proj` while training
    /// (PEFT's `lora_dropout`, [`crate::lora`]); probability 0 (none) unless
    /// [`with_adapter_dropout`](Self::with_adapter_dropout) sets it.
    pub adapter_dropout: Dropout,
    /// Number of (query) heads.
    pub n_heads: usize,
    /// Number of key/value heads; divides `n_heads` ([`crate::grouped`]).
    pub n_kv_heads: usize,
    /// Longest sequence accepted.
    pub max_seq_len: usize,
    /// Implementation of the attention core: the config's, fixed when the layer is built.
    #[module(skip)]
    pub(crate) kernel: AttentionKernel,
    /// Rotary positions' base, when queries and keys are rotated ([`crate::rope`]).
    #[module(skip)]
    pub rope_base: Option<f64>,
    /// QK-norm's ε, when queries and keys are normalised ([`crate::qk_norm`]).
    #[module(skip)]
    pub qk_norm_eps: Option<f64>,
    /// Burn's ops or tinygpt's CubeCL kernels: decided once, from the device, when the layer is
    /// built ([`Kernels::for_device`]); [`with_kernels`](Self::with_kernels) chooses otherwise.
    #[module(skip)]
    kernels: Kernels,
    /// How the decode forwards (`decode.rs`) multiply a step's few rows by the projections:
    /// Burn's matmul unless the model brought a kernel for them
    /// ([`with_decode_product`](Self::with_decode_product)).
    #[module(skip)]
    pub(crate) decode_product: DecodeProduct,
}

/// Where the rows of an input sit in their sequences.
#[derive(Clone, Copy)]
pub(crate) enum At<'a> {
    /// Every sequence's tokens at positions `offset..offset + seq`.
    From(usize),
    /// One token per sequence, sequence `r`'s at `positions[r]`.
    Rows(&'a [usize]),
    /// A decode step's rows, their rotation already on the device.
    Step(&'a StepAt),
}

/// Queries, keys and values, each `[batch, heads, seq, d_head]`.
pub(crate) struct Heads {
    pub(crate) q: Tensor<4>,
    pub(crate) k: Tensor<4>,
    pub(crate) v: Tensor<4>,
}

/// Which implementation a call's attention core takes (see [`AttentionKernel`]).
enum Core {
    Flash,
    Sdpa,
    Explicit,
}

impl CausalSelfAttentionConfig {
    /// Validates the config and creates the layer on `device`, running the device's
    /// [`Kernels`].
    pub fn init(&self, device: &Device) -> Result<CausalSelfAttention, AttentionConfigError> {
        self.validate()?;
        let d = self.d_model;
        let d_head = d / self.n_heads;
        // GPT-2's init: weights ~ N(0, std), biases 0 (Burn's default would be Kaiming-uniform);
        // a standard deviation of 0 is the zero init (modded-nanogpt's output projections).
        let linear = |d_in: usize, d_out: usize, std: f64| Linear {
            weight: match std {
                0.0 => Initializer::Zeros,
                std => Initializer::Normal { mean: 0.0, std },
            }
            .init([d_in, d_out], device),
            bias: self.bias.then(|| Initializer::Zeros.init([d_out], device)),
        };
        let qkv = (self.n_heads + 2 * self.kv_heads()) * d_head;
        Ok(CausalSelfAttention {
            c_attn: linear(d, qkv, self.init_std),
            c_proj: linear(d, d, self.proj_init_std.unwrap_or(self.init_std)),
            attn_dropout: DropoutConfig::new(self.dropout).init(),
            resid_dropout: DropoutConfig::new(self.dropout).init(),
            adapter_dropout: DropoutConfig::new(0.0).init(),
            n_heads: self.n_heads,
            n_kv_heads: self.kv_heads(),
            max_seq_len: self.max_seq_len,
            kernel: self.kernel,
            rope_base: self.rope_base,
            qk_norm_eps: self.qk_norm_eps,
            kernels: Kernels::for_device(device),
            decode_product: burn_product,
        })
    }
}

impl CausalSelfAttention {
    /// Width of the residual stream.
    pub fn d_model(&self) -> usize {
        self.c_proj.weight.dims()[1]
    }

    /// The dtype the layer computes in: its projections' (f32, or bf16/f16 for a
    /// mixed-precision step). Its input must come in this dtype; the softmax is f32 regardless.
    pub fn dtype(&self) -> DType {
        self.c_attn.weight.dtype()
    }

    /// Attends over `x`: `[batch, seq, d_model] -> [batch, seq, d_model]`, as a training step's
    /// forward or not (`pass`, [`crate::pass`]).
    ///
    /// `key_padding`: optional `[batch, seq]`, `true` where the token is padding. Padded keys get
    /// weight 0; a query whose keys are all padding gets zeros, never `NaN`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        pass: Pass,
    ) -> Result<Tensor<3>, AttentionError> {
        let [batch, seq, _] = self.check_input(&x, 0)?;
        check_pass(&x, pass)?;
        check_padding(&key_padding, batch, seq)?;
        let padded = key_padding.is_some();
        // Queries, keys and values side by side: [batch, seq, (heads + 2·kv_heads)·d_head].
        let qkv = project(&self.c_attn, x, &self.adapter_dropout, pass);
        let y = match self.core(padded, pass) {
            // The kernels read the heads where the projection wrote them (normalised and
            // rotated in place) and write the output as the output projection reads it.
            Core::Flash => {
                let dropout = self.dropout_probability(pass);
                let heads = (self.n_heads, self.n_kv_heads);
                flash_attention_packed(self.packed_heads(qkv), heads.0, heads.1, dropout)
            }
            // The others take each query head's keys and values repeated.
            Core::Sdpa => {
                let heads = self.grouped(self.heads(qkv, At::From(0)));
                let mask = key_padding.map(|padding| self.mask(batch, seq, 0, seq, Some(padding)));
                let is_causal = mask.is_none();
                concat_heads(sdpa(heads, mask, is_causal))
            }
            Core::Explicit => {
                let heads = self.grouped(self.heads(qkv, At::From(0)));
                let mask = self.mask(batch, seq, 0, seq, key_padding);
                concat_heads(self.explicit(heads, Some(mask), padded, pass).0)
            }
        };
        let out = project(&self.c_proj, y, &self.adapter_dropout, pass);
        Ok(pass.dropout(&self.resid_dropout, out))
    }

    /// Like [`forward`](Self::forward), and also returns the attention weights
    /// `[batch, heads, seq, seq]` (before dropout): rows sum to 1 over the visible keys, entries
    /// above the diagonal are exactly 0. Always takes the explicit path.
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
        pass: Pass,
    ) -> Result<(Tensor<3>, Tensor<4>), AttentionError> {
        let [batch, seq, _] = self.check_input(&x, 0)?;
        check_pass(&x, pass)?;
        check_padding(&key_padding, batch, seq)?;
        let padded = key_padding.is_some();
        let mask = self.mask(batch, seq, 0, seq, key_padding);
        let qkv = project(&self.c_attn, x, &self.adapter_dropout, pass);
        let heads = self.grouped(self.heads(qkv, At::From(0)));
        let (y, weights) = self.explicit(heads, Some(mask), padded, pass);
        let y = project(&self.c_proj, concat_heads(y), &self.adapter_dropout, pass);
        Ok((pass.dropout(&self.resid_dropout, y), weights))
    }

    /// This layer with dropout of probability `p` on the inputs of the LoRA adapters its
    /// projections carry, while training ([`crate::lora::project`]).
    pub fn with_adapter_dropout(mut self, p: f64) -> Self {
        self.adapter_dropout = DropoutConfig::new(p).init();
        self
    }

    /// This layer running `kernels` (the same numbers to float rounding): for a caller that
    /// decides otherwise than [`Kernels::for_device`], e.g. to measure one against the other.
    pub fn with_kernels(mut self, kernels: Kernels) -> Self {
        self.kernels = kernels;
        self
    }

    /// This layer's weights with its core computed by `kernel` (the same numbers to float
    /// rounding): for comparing one core against another on the same weights.
    pub fn with_kernel(mut self, kernel: AttentionKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// How this layer computes its core (its config's [`AttentionKernel`]).
    pub fn kernel(&self) -> AttentionKernel {
        self.kernel
    }

    /// The kernels this layer runs.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// This layer with its decode forwards' projections multiplied by `product` (see
    /// [`DecodeProduct`]); the same numbers to float rounding.
    pub fn with_decode_product(mut self, product: DecodeProduct) -> Self {
        self.decode_product = product;
        self
    }

    pub(crate) fn check_input(
        &self,
        x: &Tensor<3>,
        past: usize,
    ) -> Result<[usize; 3], AttentionError> {
        let dims = x.dims();
        let [_, seq, width] = dims;
        if width != self.d_model() {
            return Err(AttentionError::WidthMismatch {
                expected: self.d_model(),
                got: width,
            });
        }
        if seq == 0 {
            return Err(AttentionError::EmptySequence);
        }
        if past + seq > self.max_seq_len {
            return Err(AttentionError::SequenceTooLong {
                len: past + seq,
                max: self.max_seq_len,
            });
        }
        Ok(dims)
    }

    /// The attention weights' dropout probability on `pass`: 0 outside training.
    fn dropout_probability(&self, pass: Pass) -> f64 {
        match pass.drops(&self.attn_dropout) {
            true => self.attn_dropout.prob,
            false => 0.0,
        }
    }

    /// Which core attends: the layer's [`AttentionKernel`] and [`Kernels`], both fixed when it
    /// was built, for what the call brings (its pass, padding; the projections' dtype).
    fn core(&self, padded: bool, pass: Pass) -> Core {
        let training = pass == Pass::Train;
        let d_head = self.d_model() / self.n_heads;
        let flash = !padded && flash::supported(self.kernels, self.dtype(), d_head);
        match self.kernel {
            AttentionKernel::Flash if flash => Core::Flash,
            AttentionKernel::Auto if flash && training => Core::Flash,
            AttentionKernel::Sdpa if !pass.drops(&self.attn_dropout) => Core::Sdpa,
            // Under autodiff the SDPA op was slower than the explicit one on CPU, and padding
            // needs a materialised mask anyway.
            AttentionKernel::Auto if !training && !padded => Core::Sdpa,
            AttentionKernel::Auto
            | AttentionKernel::Explicit
            | AttentionKernel::Flash
            | AttentionKernel::Sdpa => Core::Explicit,
        }
    }

    /// The projection's output `qkv` `[batch, seq, (heads + 2·kv_heads)·d_head]` for positions
    /// `at` -> queries `[batch, n_heads, seq, d_head]`, keys and values
    /// `[batch, n_kv_heads, seq, d_head]`; queries and keys normalised (QK-norm) and then
    /// rotated (RoPE) when the layer does so.
    pub(crate) fn heads(&self, qkv: Tensor<3>, at: At) -> Heads {
        let [batch, seq, _] = qkv.dims();
        let (heads, kv) = (self.n_heads, self.n_kv_heads);
        let d_head = self.d_model() / heads;
        // Columns q | k | v, each head's `d_head` channels together: `heads + 2·kv` head-wide
        // column groups.
        let qkv = qkv
            .reshape([batch, seq, heads + 2 * kv, d_head])
            .swap_dims(1, 2);
        let part = |from: usize, n: usize| qkv.clone().narrow(1, from, n);
        let (mut q, mut k, v) = (part(0, heads), part(heads, kv), part(heads + kv, kv));
        if let Some(eps) = self.qk_norm_eps {
            q = rms_norm_heads(q, eps);
            k = rms_norm_heads(k, eps);
        }
        if let Some(base) = self.rope_base {
            let rows = match at {
                At::From(offset) => RopeRows::new(offset, seq, d_head, base, &q.device()),
                At::Rows(positions) => RopeRows::at(positions, d_head, base, &q.device()),
                // The decode step checked that its tables rotate.
                At::Step(step) => step.rope().cloned().expect("a rotating step"),
            };
            q = rows.apply(q);
            k = rows.apply(k);
        }
        Heads { q, k, v }
    }

    /// The projection's output `qkv` `[batch, seq, (heads + 2·kv_heads)·d_head]` for positions
    /// `0..seq`, its queries and keys normalised (QK-norm) and then rotated (RoPE) in place of
    /// their columns when the layer does so, as [`heads`](Self::heads) does to them split, in
    /// one kernel ([`packed_qk`]): same shape. Only on the flash path (a CubeCL device).
    fn packed_heads(&self, qkv: Tensor<3>) -> Tensor<3> {
        if self.rope_base.is_none() && self.qk_norm_eps.is_none() {
            return qkv;
        }
        let [_, seq, width] = qkv.dims();
        let (heads, kv) = (self.n_heads, self.n_kv_heads);
        let d_head = width / (heads + 2 * kv);
        let rope = self
            .rope_base
            .map(|base| RopeRows::new(0, seq, d_head, base, &qkv.device()));
        let prep = QkPrep {
            qk_norm_eps: self.qk_norm_eps,
            rope: rope.as_ref(),
        };
        packed_qk::normalise_and_rotate(qkv, heads, kv, prep)
    }

    /// Keys and values repeated for their query heads' groups ([`repeat_kv`]): every kernel
    /// below then sees `n_heads` of each. A no-op without grouped heads.
    pub(crate) fn grouped(&self, Heads { q, k, v }: Heads) -> Heads {
        let group = self.n_heads / self.n_kv_heads;
        if group == 1 {
            return Heads { q, k, v };
        }
        Heads {
            q,
            k: repeat_kv(k, group),
            v: repeat_kv(v, group),
        }
    }

    /// The hidden positions for `new` queries after `past` cached tokens among `keys` keys
    /// (`past + new`, or more for a fixed cache whose rows past those are empty), `true` =
    /// hidden: the causal mask, or-ed with the key padding when given. `[batch, heads, new, keys]`.
    pub(crate) fn mask(
        &self,
        batch: usize,
        new: usize,
        past: usize,
        keys: usize,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Tensor<4, Bool> {
        let shape = [batch, self.n_heads, new, keys];
        let device = self.c_proj.weight.device();
        let causal = causal_mask_with_offset(new, keys, past, &device)
            .reshape([1, 1, new, keys])
            .expand(shape);
        match key_padding {
            Some(padding) => causal.bool_or(padding.reshape([batch, 1, 1, keys]).expand(shape)),
            None => causal,
        }
    }

    /// The attention core written out, op by op, as the seeds' notebooks do. Returns the
    /// output `[batch, heads, seq, d_head]` and the weights `[batch, heads, seq, keys]` (before
    /// dropout).
    ///
    /// `zero_hidden`: after the softmax, set hidden weights to exactly 0. Needed with padding: a
    /// row whose keys are all hidden would otherwise spread its weight evenly over them.
    pub(crate) fn explicit(
        &self,
        Heads { q, k, v }: Heads,
        mask: Option<Tensor<4, Bool>>,
        zero_hidden: bool,
        pass: Pass,
    ) -> (Tensor<4>, Tensor<4>) {
        let d_head = q.dims()[3];
        let dtype = v.dtype();
        // Scaling q (seq·d_head values) is cheaper than scaling the scores (seq·seq values).
        // The matmuls run in the projections' dtype (bf16 or f16 in mixed precision); the
        // mask and the softmax always in f32, where exp cannot overflow and small weights keep
        // their digits (a no-op cast in f32).
        let scores = (q * (1.0 / (d_head as f64).sqrt()))
            .matmul(k.swap_dims(2, 3))
            .cast(FloatDType::F32);
        let weights = match mask {
            Some(mask) if zero_hidden => {
                mask_then_softmax(scores, mask.clone()).mask_fill(mask, 0.0)
            }
            Some(mask) => mask_then_softmax(scores, mask),
            None => burn::tensor::activation::softmax(scores, 3),
        };
        let y = pass
            .dropout(&self.attn_dropout, weights.clone().cast(dtype))
            .matmul(v);
        (y, weights)
    }
}

/// `[batch, heads, seq, d_head]` -> the heads side by side, `[batch, seq, heads·d_head]`: what
/// the output projection reads.
pub(crate) fn concat_heads(y: Tensor<4>) -> Tensor<3> {
    let [batch, heads, seq, d_head] = y.dims();
    y.swap_dims(1, 2).reshape([batch, seq, heads * d_head])
}

/// Burn's scaled dot-product attention op (PyTorch's `scaled_dot_product_attention`): `mask` (`true` = hidden) and/or its built-in causal mask.
pub(crate) fn sdpa(
    Heads { q, k, v }: Heads,
    mask: Option<Tensor<4, Bool>>,
    is_causal: bool,
) -> Tensor<4> {
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal,
    };
    attention(q, k, v, mask, None, options)
}

/// A training pass needs a device that tracks gradients: nothing else could take its backward,
/// and Burn's dropout acts only there.
fn check_pass(x: &Tensor<3>, pass: Pass) -> Result<(), AttentionError> {
    match pass {
        Pass::Train if !x.device().is_autodiff() => Err(AttentionError::TrainWithoutGradients),
        Pass::Train | Pass::Infer => Ok(()),
    }
}

fn check_padding(
    key_padding: &Option<Tensor<2, Bool>>,
    batch: usize,
    seq: usize,
) -> Result<(), AttentionError> {
    match key_padding {
        Some(padding) if padding.dims() != [batch, seq] => Err(AttentionError::PaddingMaskShape {
            expected: [batch, seq],
            got: padding.dims(),
        }),
        _ => Ok(()),
    }
}
