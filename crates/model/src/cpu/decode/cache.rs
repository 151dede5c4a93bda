//! [`StreamCache`]: one sequence's keys and values on the host, what [`FusedDecoder`] holds
//! for its sequence and [`FusedBatch`] for each of its streams (swapped into its single decoder
//! to run a window).
//!
//! [`FusedDecoder`]: super::FusedDecoder
//! [`FusedBatch`]: super::FusedBatch

/// One stream's KV cache: per block, keys and values `[block_size, kv_width]`, rows `0..len`
/// filled.
#[derive(Debug, Clone)]
pub(crate) struct StreamCache {
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
    pub len: usize,
    /// The token at row `len - 1`, what the next token pairs with in a bigram table (read
    /// only while `len > 0`).
    pub last: u32,
}

impl StreamCache {
    /// An empty cache of `layers` blocks of `block_size` rows of `kv_width`. Each buffer is
    /// its own zeroed allocation, which the system backs with memory only as rows are written:
    /// a server's streams cost what their sequences fill, not their whole context each (a
    /// copy of one zeroed buffer would be written, so resident, at once).
    pub fn new(layers: usize, block_size: usize, kv_width: usize) -> Self {
        let zeroed = || {
            (0..layers)
                .map(|_| vec![0.0; block_size * kv_width])
                .collect()
        };
        Self {
            keys: zeroed(),
            values: zeroed(),
            len: 0,
            last: 0,
        }
    }

    /// The token before the row at `position` of a feed whose tokens are `tokens` from `past`
    /// on: `None` at the context's start.
    pub fn before(&self, tokens: &[u32], past: usize, position: usize) -> Option<usize> {
        match position {
            0 => None,
            p if p > past => Some(tokens[p - past - 1] as usize),
            _ => Some(self.last as usize),
        }
    }
}
