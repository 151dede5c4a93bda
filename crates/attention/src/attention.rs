//! The layer: causal multi-head self-attention.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Initializer, Linear};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, DType, Device, FloatDType, Tensor};

use crate::config::{AttentionKernel, CausalSelfAttentionConfig};
use crate::decode_attention;
use crate::error::{AttentionConfigError, AttentionError};
use crate::flash::{self, flash_attention_packed};
use crate::grouped::repeat_kv;
use crate::kv_cache::KvCache;
use crate::mask::{causal_mask_with_offset, lengths_mask, mask_then_softmax};
use crate::qk_norm::{QueryAndKeyHeads, rms_norm_heads, rms_norm_packed};
use crate::rope::RopeRows;
use crate::rows_linear;
use crate::step::{Seen, StepAt};

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
    /// Number of (query) heads.
    pub n_heads: usize,
    /// Number of key/value heads; divides `n_heads` ([`crate::grouped`]).
    pub n_kv_heads: usize,
    /// Longest sequence accepted.
    pub max_seq_len: usize,
    /// Implementation of the attention core.
    #[module(skip)]
    pub kernel: AttentionKernel,
    /// Rotary positions' base, when queries and keys are rotated ([`crate::rope`]).
    #[module(skip)]
    pub rope_base: Option<f64>,
    /// QK-norm's ε, when queries and keys are normalised ([`crate::qk_norm`]).
    #[module(skip)]
    pub qk_norm_eps: Option<f64>,
}

/// Where the rows of an input sit in their sequences.
#[derive(Clone, Copy)]
enum At<'a> {
    /// Every sequence's tokens at positions `offset..offset + seq`.
    From(usize),
    /// One token per sequence, sequence `r`'s at `positions[r]`.
    Rows(&'a [usize]),
    /// A decode step's rows, their rotation already on the device.
    Step(&'a StepAt),
}

/// Queries, keys and values, each `[batch, heads, seq, d_head]`.
struct Heads {
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
}

impl CausalSelfAttentionConfig {
    /// Validates the config and creates the layer on `device`.
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
            n_heads: self.n_heads,
            n_kv_heads: self.kv_heads(),
            max_seq_len: self.max_seq_len,
            kernel: self.kernel,
            rope_base: self.rope_base,
            qk_norm_eps: self.qk_norm_eps,
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

    /// Attends over `x`: `[batch, seq, d_model] -> [batch, seq, d_model]`.
    ///
    /// `key_padding`: optional `[batch, seq]`, `true` where the token is padding. Padded keys get
    /// weight 0; a query whose keys are all padding gets zeros, never `NaN`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Result<Tensor<3>, AttentionError> {
        let [batch, seq, _] = self.check_input(&x, 0)?;
        check_padding(&key_padding, batch, seq)?;
        let flash = self.use_flash(&x, key_padding.is_some());
        let dropout = match self.dropout_active(&x.device()) {
            true => self.attn_dropout.prob,
            false => 0.0,
        };
        // The heads are the projection's columns, normalised and rotated there: the kernels
        // read them in place (each query head's key/value head too) and write the output as
        // the output projection reads it.
        if flash {
            let qkv = self.packed_heads(rows_linear::linear(&self.c_attn, x));
            let y = flash_attention_packed(qkv, self.n_heads, self.n_kv_heads, dropout);
            return Ok(self.project(y));
        }
        let heads = self.heads(x, At::From(0));
        // The other paths take each query head's keys and values repeated.
        let y = if self.use_sdpa(&heads.q.device(), key_padding.is_some()) {
            let mask = key_padding.map(|padding| self.mask(batch, seq, 0, seq, Some(padding)));
            let is_causal = mask.is_none();
            sdpa(self.grouped(heads), mask, is_causal)
        } else {
            let padded = key_padding.is_some();
            let mask = self.mask(batch, seq, 0, seq, key_padding);
            self.explicit(self.grouped(heads), Some(mask), padded).0
        };
        Ok(self.merge_heads(y))
    }

    /// Like [`forward`](Self::forward), and also returns the attention weights
    /// `[batch, heads, seq, seq]` (before dropout): rows sum to 1 over the visible keys, entries
    /// above the diagonal are exactly 0. Always takes the explicit path.
    pub fn forward_with_weights(
        &self,
        x: Tensor<3>,
        key_padding: Option<Tensor<2, Bool>>,
    ) -> Result<(Tensor<3>, Tensor<4>), AttentionError> {
        let [batch, seq, _] = self.check_input(&x, 0)?;
        check_padding(&key_padding, batch, seq)?;
        let padded = key_padding.is_some();
        let mask = self.mask(batch, seq, 0, seq, key_padding);
        let (y, weights) =
            self.explicit(self.grouped(self.heads(x, At::From(0))), Some(mask), padded);
        Ok((self.merge_heads(y), weights))
    }

    /// Incremental decoding: attends the new tokens `x` (`[batch, new, d_model]`) over the
    /// cached keys/values plus their own, appends their keys/values to `cache`, and returns
    /// `[batch, new, d_model]`. Feeding a sequence in pieces gives the outputs of one
    /// [`forward`](Self::forward) over the whole sequence, at `O(seq)` work per new token instead
    /// of `O(seq²)`.
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let past = cache.len();
        let [batch, new, _] = self.check_input(&x, past)?;
        if let Some(cached) = cache.batch()
            && cached != batch
        {
            return Err(AttentionError::CacheBatchMismatch { cached, got: batch });
        }
        // The cache holds the key/value heads, rotated: a group's copies are made per call.
        let Heads { q, k, v } = self.heads(x, At::From(past));
        let (k, v) = cache.append(k, v)?;
        let keys = k.dims()[2];
        let heads = self.grouped(Heads { q, k, v });
        // One new token may see every key a growing cache holds: no mask at all. A fixed cache
        // hides its rows not written yet as if they were future tokens.
        let mask = (new > 1 || keys > past + new).then(|| self.mask(batch, new, past, keys, None));
        let y = if self.use_sdpa(&heads.q.device(), false) && mask.is_none() {
            sdpa(heads, None, false)
        } else {
            self.explicit(heads, mask, false).0
        };
        Ok(self.merge_heads(y))
    }

    /// The decode step: `x` `[rows, new, d_model]`, row `r` the `new` tokens (one, or a
    /// prompt's chunk) at `at`'s positions of row `r` of its own sequence, whose keys and
    /// values `cache` holds in its row `r` (a fixed cache of the tables' capacity,
    /// [`KvCache::with_capacity`]). Writes each token's key and value at its position and
    /// returns `[rows, new, d_model]`: row `r` is what
    /// [`forward_cached`](Self::forward_cached) gives that sequence, up to float rounding.
    pub fn forward_step(
        &self,
        x: Tensor<3>,
        at: &StepAt,
        cache: &mut KvCache,
    ) -> Result<Tensor<3>, AttentionError> {
        let [rows, new, _] = x.dims();
        if new != at.tokens_per_row() {
            return Err(AttentionError::RowTokens {
                got: new,
                step: at.tokens_per_row(),
            });
        }
        if rows != at.rows() {
            return Err(AttentionError::RowCaches {
                rows,
                caches: at.rows(),
            });
        }
        let capacity = at.capacity();
        if cache.capacity() != Some(capacity) {
            return Err(AttentionError::StepCache {
                capacity: cache.capacity(),
                expected: capacity,
            });
        }
        if self.rope_base.is_some() && at.rope().is_none() {
            return Err(AttentionError::StepRope);
        }
        self.check_input(&x, 0)?;
        if let Some(&p) = at.host().iter().find(|&&p| p >= self.max_seq_len) {
            return Err(AttentionError::SequenceTooLong {
                len: p + 1,
                max: self.max_seq_len,
            });
        }
        let Heads { q, k, v } = self.heads(x, At::Step(at));
        let (k, v) = cache.write_at(k, v, &at.positions(), at.host())?;
        match at.seen() {
            // One kernel a layer, grouped heads read in place (see `decode_attention`).
            Seen::Positions(positions) => Ok(self.project(decode_attention::decode_attention(
                q,
                k,
                v,
                positions.clone(),
            ))),
            Seen::Hidden(hidden) => {
                let heads = self.grouped(Heads { q, k, v });
                let mask = hidden.clone().expand([rows, self.n_heads, new, capacity]);
                Ok(self.merge_heads(self.explicit(heads, Some(mask), false).0))
            }
        }
    }

    /// Continuous batching's step: the next token of each of `rows` sequences of different
    /// lengths, `x` `[rows, 1, d_model]`, row `r` following the tokens `caches[r]` holds (each
    /// cache one sequence's; either layout). Each row's key and value join its own cache; the
    /// rows' keys are stacked (to the longest row, or a fixed cache's capacity) and each query
    /// sees its own row's only, the
    /// others' hidden like padding ([`lengths_mask`](crate::mask::lengths_mask)). Returns
    /// `[rows, 1, d_model]`: row `r` is what [`forward_cached`](Self::forward_cached) gives that
    /// sequence alone, up to float rounding (the products have other shapes).
    ///
    /// The weights are read once for all rows: at one token a sequence is a matrix-vector
    /// product that waits on memory, and a batch of them is a matrix product that does not.
    pub fn forward_rows(
        &self,
        x: Tensor<3>,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor<3>, AttentionError> {
        let [rows, new, _] = x.dims();
        if rows == 0 {
            return Err(AttentionError::EmptySequence);
        }
        if new != 1 {
            return Err(AttentionError::RowTokens { got: new, step: 1 });
        }
        if caches.len() != rows || caches.iter().any(|c| c.batch().is_some_and(|b| b != 1)) {
            return Err(AttentionError::RowCaches {
                rows,
                caches: caches.len(),
            });
        }
        let positions: Vec<usize> = caches.iter().map(|c| c.len()).collect();
        let longest = positions.iter().max().map_or(0, |&p| p + 1);
        self.check_input(&x, longest - 1)?;
        // Fixed caches keep their whole capacity, so every step runs the same shapes (what a
        // GPU compiles and tunes for); growing ones stack to the longest row.
        let keys = caches
            .iter()
            .filter_map(|c| c.capacity())
            .fold(longest, usize::max);
        let Heads { q, k, v } = self.heads(x, At::Rows(&positions));
        let (mut stacked_keys, mut stacked_values) = (Vec::new(), Vec::new());
        for (r, cache) in caches.iter_mut().enumerate() {
            let (k, v) = cache.append(k.clone().narrow(0, r, 1), v.clone().narrow(0, r, 1))?;
            stacked_keys.push(stacked(k, keys));
            stacked_values.push(stacked(v, keys));
        }
        let lengths: Vec<usize> = positions.iter().map(|p| p + 1).collect();
        let mask = lengths_mask(&lengths, keys, &q.device())
            .reshape([rows, 1, 1, keys])
            .expand([rows, self.n_heads, 1, keys]);
        let heads = self.grouped(Heads {
            q,
            k: Tensor::cat(stacked_keys, 0),
            v: Tensor::cat(stacked_values, 0),
        });
        Ok(self.merge_heads(self.explicit(heads, Some(mask), false).0))
    }

    fn check_input(&self, x: &Tensor<3>, past: usize) -> Result<[usize; 3], AttentionError> {
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

    /// Dropout only acts when training: its flag is on and the tensors track gradients.
    fn dropout_active(&self, device: &Device) -> bool {
        self.attn_dropout.prob > 0.0
            && self.attn_dropout.training.is_enabled()
            && device.is_autodiff()
    }

    /// Whether attending over `x` (`[batch, seq, d_model]`) takes the flash kernels (see
    /// [`AttentionKernel`]).
    fn use_flash(&self, x: &Tensor<3>, padded: bool) -> bool {
        let device = x.device();
        let wanted = match self.kernel {
            AttentionKernel::Flash => true,
            AttentionKernel::Auto => device.is_autodiff(),
            AttentionKernel::Explicit | AttentionKernel::Sdpa => false,
        };
        let d_head = self.d_model() / self.n_heads;
        wanted && !padded && flash::supported(&device, self.dtype(), d_head)
    }

    /// Whether this call may take Burn's SDPA op (see [`AttentionKernel`]).
    fn use_sdpa(&self, device: &Device, padded: bool) -> bool {
        match self.kernel {
            AttentionKernel::Explicit | AttentionKernel::Flash => false,
            AttentionKernel::Sdpa => !self.dropout_active(device),
            // Under autodiff the SDPA op was slower than the explicit one on CPU, and padding
            // needs a materialised mask anyway.
            AttentionKernel::Auto => !device.is_autodiff() && !padded,
        }
    }

    /// `[batch, seq, d_model]` at positions `at` -> queries
    /// `[batch, n_heads, seq, d_head]`, keys and values `[batch, n_kv_heads, seq, d_head]`;
    /// queries and keys normalised (QK-norm) and then rotated (RoPE) when the layer does so.
    fn heads(&self, x: Tensor<3>, at: At) -> Heads {
        let [batch, seq, d_model] = x.dims();
        let (heads, kv) = (self.n_heads, self.n_kv_heads);
        let d_head = d_model / heads;
        // Columns q | k | v, each head's `d_head` channels together: `heads + 2·kv` head-wide
        // column groups.
        let qkv = rows_linear::linear(&self.c_attn, x)
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
                // forward_step checked that the step's tables rotate.
                At::Step(step) => step.rope().cloned().expect("a rotating step"),
            };
            q = rows.apply(q);
            k = rows.apply(k);
        }
        Heads { q, k, v }
    }

    /// The projection's output `qkv` `[batch, seq, (heads + 2·kv_heads)·d_head]` for positions
    /// `0..seq`, its queries and keys normalised (QK-norm) and then rotated (RoPE) in place of
    /// their columns when the layer does so, as [`heads`](Self::heads) does to them split:
    /// same shape.
    fn packed_heads(&self, qkv: Tensor<3>) -> Tensor<3> {
        if self.rope_base.is_none() && self.qk_norm_eps.is_none() {
            return qkv;
        }
        let [batch, seq, width] = qkv.dims();
        let (heads, kv) = (self.n_heads, self.n_kv_heads);
        let d_head = width / (heads + 2 * kv);
        let mut qkv = qkv.reshape([batch, seq, heads + 2 * kv, d_head]);
        let qk = QueryAndKeyHeads::new(heads + 2 * kv, heads + kv, &qkv.device());
        if let Some(eps) = self.qk_norm_eps {
            qkv = rms_norm_packed(qkv, &qk, eps);
        }
        if let Some(base) = self.rope_base {
            let rows = RopeRows::new(0, seq, d_head, base, &qkv.device());
            qkv = rows.apply_packed(qkv, &qk);
        }
        qkv.reshape([batch, seq, width])
    }

    /// Keys and values repeated for their query heads' groups ([`repeat_kv`]): every kernel
    /// below then sees `n_heads` of each. A no-op without grouped heads.
    fn grouped(&self, Heads { q, k, v }: Heads) -> Heads {
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

    /// `[batch, heads, seq, d_head]` -> concatenated heads, projected: `[batch, seq, d_model]`.
    fn merge_heads(&self, y: Tensor<4>) -> Tensor<3> {
        let [batch, heads, seq, d_head] = y.dims();
        self.project(y.swap_dims(1, 2).reshape([batch, seq, heads * d_head]))
    }

    /// The heads' outputs concatenated, `[batch, seq, d_model]`, through the output projection
    /// (and the residual dropout).
    fn project(&self, y: Tensor<3>) -> Tensor<3> {
        self.resid_dropout
            .forward(rows_linear::linear(&self.c_proj, y))
    }

    /// The hidden positions for `new` queries after `past` cached tokens among `keys` keys
    /// (`past + new`, or more for a fixed cache whose rows past those are empty), `true` =
    /// hidden: the causal mask, or-ed with the key padding when given. `[batch, heads, new, keys]`.
    fn mask(
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

    /// The attention core written out, op by op, as the classic notebook presentation does. Returns the output `[batch, heads, seq, d_head]`
    /// and the weights `[batch, heads, seq, keys]` (before dropout).
    ///
    /// `zero_hidden`: after the softmax, set hidden weights to exactly 0. Needed with padding: a
    /// row whose keys are all hidden would otherwise spread its weight evenly over them.
    fn explicit(
        &self,
        Heads { q, k, v }: Heads,
        mask: Option<Tensor<4, Bool>>,
        zero_hidden: bool,
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
        let y = self
            .attn_dropout
            .forward(weights.clone().cast(dtype))
            .matmul(v);
        (y, weights)
    }
}

/// One sequence's keys (or values) `[1, heads, n, d_head]`, `n` its length or a fixed cache's
/// capacity, as `[1, heads, keys, d_head]`: cut, or filled with zeros (hidden keys), to `keys`.
fn stacked(t: Tensor<4>, keys: usize) -> Tensor<4> {
    let [one, heads, n, d_head] = t.dims();
    match n >= keys {
        true => t.narrow(2, 0, keys),
        false => {
            let zeros =
                Tensor::<4>::zeros([one, heads, keys - n, d_head], &t.device()).cast(t.dtype());
            Tensor::cat(vec![t, zeros], 2)
        }
    }
}

/// Burn's scaled dot-product attention op (PyTorch's `scaled_dot_product_attention`): `mask` (`true` = hidden) and/or its built-in causal mask.
fn sdpa(Heads { q, k, v }: Heads, mask: Option<Tensor<4, Bool>>, is_causal: bool) -> Tensor<4> {
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal,
    };
    attention(q, k, v, mask, None, options)
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
