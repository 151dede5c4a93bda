//! Next-token cross-entropy with PyTorch's `ignore_index` meaning: the formula is taught in
//! the attention crate ([`tinygpt_attention::next_token`]); here it is checked, counted on the
//! host, and on a GPU computed by one fused kernel.

use burn::tensor::{Int, Tensor};
use tinygpt_attention::next_token::log_likelihoods;

use crate::error::LossError;
use crate::gpu::{self, Kernels};

pub use tinygpt_attention::next_token::IGNORE_INDEX;

/// Mean negative log-likelihood of `targets` under `logits`, over the targets that are not
/// [`IGNORE_INDEX`], exactly as `F.cross_entropy(logits, targets, ignore_index=-1)`.
///
/// `logits`: `[n, vocab]`; `targets`: `[n]` Int. Ignored positions contribute neither to the sum
/// nor to the count, so padding a batch changes neither the loss nor any gradient. A batch whose
/// targets are all ignored is an error (PyTorch returns `NaN`).
///
/// Burn's `CrossEntropyLoss` takes pad tokens as `usize` ids, so it cannot express -1; and a -1
/// must never reach `gather`. Ignored targets are replaced by 0 before the gather and their
/// log-probabilities multiplied by 0 after it. Computed by Burn's ops on any device: a model's
/// training and evaluation take [`cross_entropy_counted`] with the model's [`Kernels`].
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>) -> Result<Tensor<1>, LossError> {
    // One host read for the count; training knows it on the host and calls the counted form.
    let kept = targets
        .clone()
        .equal_elem(IGNORE_INDEX)
        .bool_not()
        .int()
        .sum()
        .into_scalar::<i64>();
    cross_entropy_counted(logits, targets, kept as usize, Kernels::Burn)
}

/// [`cross_entropy`] when the number of kept targets is already known on the host (counted
/// where the batch was built, see [`kept_targets`]): no read back from the device. With
/// [`Kernels::Cube`] (a model's [`Gpt::kernels`](crate::Gpt::kernels) on a GPU) and f32 logits,
/// the fused kernel ([`gpu::cross_entropy`]) computes it.
pub fn cross_entropy_counted(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    kept: usize,
    kernels: Kernels,
) -> Result<Tensor<1>, LossError> {
    let [n, _] = logits.dims();
    let [count] = targets.dims();
    if n != count {
        return Err(LossError::ShapeMismatch {
            logits: n,
            targets: count,
        });
    }
    if kept == 0 {
        return Err(LossError::AllTargetsIgnored {
            ignore_index: IGNORE_INDEX,
        });
    }
    if kernels.fuse(logits.dtype()) {
        return Ok(gpu::cross_entropy(logits, targets, kept));
    }
    Ok(cross_entropy_ops(logits, targets, kept))
}

/// [`cross_entropy_counted`] by Burn's ops (checked arguments): the CPU backends' path, and
/// what the fused GPU kernel is tested against.
#[doc(hidden)]
pub fn cross_entropy_ops(logits: Tensor<2>, targets: Tensor<1, Int>, kept: usize) -> Tensor<1> {
    gpu::sum_all(log_likelihoods(logits, targets)).neg() / kept as f32
}

/// The targets of a host-side batch that the loss counts (those not [`IGNORE_INDEX`]); none is
/// an error, as in [`cross_entropy`].
pub fn kept_targets(targets: &[i64]) -> Result<usize, LossError> {
    match targets.iter().filter(|&&t| t != IGNORE_INDEX).count() {
        0 => Err(LossError::AllTargetsIgnored {
            ignore_index: IGNORE_INDEX,
        }),
        kept => Ok(kept),
    }
}
