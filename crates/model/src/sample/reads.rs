//! Reading a device's numbers back to the host while sampling, counted.
//!
//! On a GPU a read waits for everything queued before it to finish, then copies: the host and
//! the device take turns instead of overlapping. How many reads a token costs is therefore a
//! figure of its own beside tokens/s (`tinygpt bench`'s `sample_host_reads_per_token`); every
//! read the decoders make goes through [`read_f32`], so the count is theirs exactly.

use std::sync::atomic::{AtomicU64, Ordering};

use burn::tensor::Tensor;

/// Reads made by [`read_f32`] in this process, on every thread.
static READS: AtomicU64 = AtomicU64::new(0);

/// How many times the decoders have read a device back to the host in this process so far.
pub fn host_reads() -> u64 {
    READS.load(Ordering::Relaxed)
}

/// `tensor`'s values on the host as f32, counted in [`host_reads`].
pub(crate) fn read_f32<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    READS.fetch_add(1, Ordering::Relaxed);
    tensor
        .into_data()
        .try_to_vec_as::<f32>()
        .expect("a float tensor reads back as f32")
}
