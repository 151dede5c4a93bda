//! Key/value cache for incremental decoding.

use burn::tensor::Tensor;

use crate::error::AttentionError;

/// The keys and values one attention layer has computed so far, each
/// `[batch, heads, cached, d_head]`.
///
/// When sampling, token `t + 1` needs the keys and values of tokens `0..=t`, and those never
/// change (causality: a token's key depends only on earlier tokens). Keeping them turns each new
/// token's attention from recomputing the whole prefix into one query against stored keys. Use
/// one cache per layer and pass it to
/// [`CausalSelfAttention::forward_cached`](crate::CausalSelfAttention::forward_cached).
///
/// Two layouts, the same numbers:
/// - [`KvCache::new`] grows: each token's keys are concatenated to the others, and attention
///   sees exactly the tokens cached. On a CPU that is the least work.
/// - [`KvCache::with_capacity`] holds `[batch, heads, capacity, d_head]` from the start and
///   writes each token's keys into its row; attention sees all `capacity` rows with the rows
///   not written yet masked like future tokens. Every token then runs the same tensor shapes,
///   which a GPU backend compiles and tunes its kernels for once, instead of once per length.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Option<Tensor<4>>,
    values: Option<Tensor<4>>,
    /// Tokens written (for the growing layout, the tensors' length).
    len: usize,
    /// `Some(rows)` for the fixed layout.
    capacity: Option<usize>,
}

impl KvCache {
    /// An empty cache that grows with each token.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty cache of `capacity` rows (a model's `block_size`), allocated at the first
    /// token and kept by [`clear`](Self::clear).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            capacity: Some(capacity),
            ..Self::default()
        }
    }

    /// Number of tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every cached token (e.g. before re-filling a sliding window). A fixed cache
    /// keeps its memory: the rows are overwritten as tokens come.
    pub fn clear(&mut self) {
        self.len = 0;
        if self.capacity.is_none() {
            self.keys = None;
            self.values = None;
        }
    }

    /// Records that the cache now holds `len` tokens, written on the device by a step this cache
    /// did not see (a GPU graph replaying the step writes the rows in place); at most the
    /// capacity of a fixed cache, which is the only kind a step writes.
    pub fn mark_written(&mut self, len: usize) {
        debug_assert!(self.capacity.is_some_and(|c| len <= c));
        self.len = len;
    }

    /// The fixed layout's rows, `None` for a growing cache.
    pub fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// Batch size of the cached tokens, if any.
    pub(crate) fn batch(&self) -> Option<usize> {
        match self.len {
            0 => None,
            _ => self.keys.as_ref().map(|k| k.dims()[0]),
        }
    }

    /// Appends new keys/values `[batch, heads, new, d_head]` and returns all of them:
    /// `[batch, heads, cached + new, d_head]`, or `[batch, heads, capacity, d_head]` for a fixed
    /// cache (rows from `cached + new` on hold nothing and must be masked).
    pub(crate) fn append(
        &mut self,
        keys: Tensor<4>,
        values: Tensor<4>,
    ) -> Result<(Tensor<4>, Tensor<4>), AttentionError> {
        let new = keys.dims()[2];
        let (keys, values) = match self.capacity {
            None => {
                let join = |old: Option<Tensor<4>>, new: Tensor<4>| match old {
                    Some(old) => Tensor::cat(vec![old, new], 2),
                    None => new,
                };
                (
                    join(self.keys.take(), keys),
                    join(self.values.take(), values),
                )
            }
            Some(capacity) => {
                if self.len + new > capacity {
                    return Err(AttentionError::SequenceTooLong {
                        len: self.len + new,
                        max: capacity,
                    });
                }
                let keys = self.write(Rows::Keys, capacity, keys);
                let values = self.write(Rows::Values, capacity, values);
                (keys, values)
            }
        };
        self.len += new;
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        Ok((keys, values))
    }

    /// The buffers, taken out (a write then owns them alone and may write them in place).
    pub(crate) fn take_buffers(&mut self) -> (Option<Tensor<4>>, Option<Tensor<4>>) {
        (self.keys.take(), self.values.take())
    }

    /// The buffers after a write, holding `len` tokens.
    pub(crate) fn set_buffers(&mut self, keys: Tensor<4>, values: Tensor<4>, len: usize) {
        self.keys = Some(keys);
        self.values = Some(values);
        self.len = len;
    }

    /// `rows` `[batch, heads, new, d_head]` written at rows `len..len + new` of the fixed
    /// buffer, which is made (zeros) when there is none of this shape yet.
    fn write(&mut self, which: Rows, capacity: usize, rows: Tensor<4>) -> Tensor<4> {
        let [batch, heads, new, d_head] = rows.dims();
        let full = [batch, heads, capacity, d_head];
        let slot = match which {
            Rows::Keys => self.keys.take(),
            Rows::Values => self.values.take(),
        };
        let buffer = match slot {
            Some(buffer) if buffer.dims() == full => buffer,
            // In the rows' dtype: a bf16 decoder keeps bf16 keys and values (half the bytes).
            _ => Tensor::zeros(full, (&rows.device(), rows.dtype())),
        };
        buffer.slice_assign(
            [0..batch, 0..heads, self.len..self.len + new, 0..d_head],
            rows,
        )
    }
}

#[derive(Clone, Copy)]
enum Rows {
    Keys,
    Values,
}
