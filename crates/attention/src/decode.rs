//! The layer's decode forwards: a sequence fed in pieces through a [`KvCache`]
//! ([`forward_cached`](CausalSelfAttention::forward_cached)), the decode step a GPU records and
//! replays ([`forward_step`](CausalSelfAttention::forward_step), `step.rs`), and continuous
//! batching's step of many sequences at once ([`forward_rows`](CausalSelfAttention::forward_rows)).
//! Each gives what [`forward`](CausalSelfAttention::forward) gives over the whole sequence, to
//! float rounding; the tests check it.

use burn::tensor::Tensor;

use crate::attention::{At, CausalSelfAttention, Heads, concat_heads, sdpa};
use crate::config::AttentionKernel;
use crate::decode_attention::decode_attention;
use crate::error::AttentionError;
use crate::kv_cache::KvCache;
use crate::mask::lengths_mask;
use crate::pass::Pass;
use crate::step::{Seen, StepAt};

impl CausalSelfAttention {
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
        let qkv = (self.decode_product)(&self.c_attn, x);
        let Heads { q, k, v } = self.heads(qkv, At::From(past));
        let (k, v) = cache.append(k, v)?;
        let keys = k.dims()[2];
        let heads = self.grouped(Heads { q, k, v });
        // One new token may see every key a growing cache holds: no mask at all. A fixed cache
        // hides its rows not written yet as if they were future tokens.
        let mask = (new > 1 || keys > past + new).then(|| self.mask(batch, new, past, keys, None));
        let y = match mask.is_none() && self.sdpa_without_mask() {
            true => sdpa(heads, None, false),
            false => self.explicit(heads, mask, false, Pass::Infer).0,
        };
        Ok(self.project(concat_heads(y)))
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
        let qkv = (self.decode_product)(&self.c_attn, x);
        let Heads { q, k, v } = self.heads(qkv, At::Step(at));
        let (k, v) = cache.write_at(k, v, &at.positions(), at.host())?;
        match at.seen() {
            // One kernel a layer, grouped heads read in place (see `decode_attention`).
            Seen::Positions(positions) => {
                Ok(self.project(decode_attention(q, k, v, positions.clone())))
            }
            Seen::Hidden(hidden) => {
                let heads = self.grouped(Heads { q, k, v });
                let mask = hidden.clone().expand([rows, self.n_heads, new, capacity]);
                Ok(self.project(concat_heads(
                    self.explicit(heads, Some(mask), false, Pass::Infer).0,
                )))
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
        let qkv = (self.decode_product)(&self.c_attn, x);
        let Heads { q, k, v } = self.heads(qkv, At::Rows(&positions));
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
        Ok(self.project(concat_heads(
            self.explicit(heads, Some(mask), false, Pass::Infer).0,
        )))
    }

    /// The heads' outputs side by side, `[rows, new, d_model]`, through the output projection
    /// (decoding is an inference pass: no dropout).
    fn project(&self, y: Tensor<3>) -> Tensor<3> {
        (self.decode_product)(&self.c_proj, y)
    }

    /// Whether a decode call whose every key is visible takes Burn's SDPA op (see
    /// [`AttentionKernel`]): asked for it, or left to the layer (decoding never trains).
    fn sdpa_without_mask(&self) -> bool {
        match self.kernel {
            AttentionKernel::Sdpa | AttentionKernel::Auto => true,
            AttentionKernel::Explicit | AttentionKernel::Flash => false,
        }
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
