//! Key/value cache for incremental decoding.

use burn::tensor::Tensor;

/// The keys and values one attention layer has computed so far, each
/// `[batch, heads, cached, d_head]`.
///
/// When sampling, token `t + 1` needs the keys and values of tokens `0..=t`, and those never
/// change (causality: a token's key depends only on earlier tokens). Keeping them turns each new
/// token's attention from recomputing the whole prefix into one query against stored keys. Use
/// one cache per layer and pass it to
/// [`CausalSelfAttention::forward_cached`](crate::CausalSelfAttention::forward_cached).
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Option<Tensor<4>>,
    values: Option<Tensor<4>>,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of tokens cached.
    pub fn len(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every cached token (e.g. before re-filling a sliding window).
    pub fn clear(&mut self) {
        *self = Self::default();
    }

    /// Batch size of the cached tensors, if any.
    pub(crate) fn batch(&self) -> Option<usize> {
        self.keys.as_ref().map(|k| k.dims()[0])
    }

    /// Appends new keys/values `[batch, heads, new, d_head]` and returns all of them
    /// `[batch, heads, cached + new, d_head]`.
    pub(crate) fn append(&mut self, keys: Tensor<4>, values: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
        let join = |old: Option<Tensor<4>>, new: Tensor<4>| match old {
            Some(old) => Tensor::cat(vec![old, new], 2),
            None => new,
        };
        let keys = join(self.keys.take(), keys);
        let values = join(self.values.take(), values);
        self.keys = Some(keys.clone());
        self.values = Some(values.clone());
        (keys, values)
    }
}
