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
}
