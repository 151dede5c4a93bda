//! # After attention: the next-token loss, and `ignore_index`
//!
//! A GPT's last layer turns each position's output into `logits` over the vocabulary
//! (`[n, vocab]` for `n = batch · seq` positions). Position `i` of a sequence is trained to
//! predict token `i + 1`: the targets are the inputs shifted left by one, so a window of
//! `seq + 1` tokens gives `seq` (input, target) pairs, and the causal mask is what keeps this
//! honest (position `i` never sees token `i + 1`).
//!
//! The loss is the mean negative log-likelihood of the targets, PyTorch's
//! `F.cross_entropy(logits, targets, ignore_index=-1)`:
//!
//! ```text
//! loss = −(1 / kept) · Σ_{i : targets[i] ≠ −1} log_softmax(logits[i])[targets[i]]
//! ```
//!
//! A target of [`IGNORE_INDEX`] (−1) marks a position that must not count: padding after a
//! short sequence, or a prompt's tokens when only the answer is trained. It adds nothing to the
//! sum *and* nothing to the count `kept`, so padding a batch changes neither the loss nor any
//! gradient (the tests prove both). −1 can never reach a gather (it is no row of the softmax):
//! [`log_likelihoods`] looks up a harmless 0 there and multiplies the result by 0.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor};

/// Targets equal to this are skipped (nanoGPT and PyTorch's examples use −1).
pub const IGNORE_INDEX: i64 = -1;

/// Each position's log-probability of its target, 0 where the target is [`IGNORE_INDEX`]:
/// `logits [n, vocab]`, `targets [n]` → `[n]`. The loss is minus their sum over the kept
/// targets' count.
pub fn log_likelihoods(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let [n, _] = logits.dims();
    let ignored = targets.clone().equal_elem(IGNORE_INDEX);
    let keep = ignored.clone().bool_not().float();
    let safe_targets = targets.mask_fill(ignored, 0).reshape([n, 1]);
    let log_probs = log_softmax(logits, 1).gather(1, safe_targets).reshape([n]);
    log_probs * keep
}

/// The mean negative log-likelihood of the targets that are not [`IGNORE_INDEX`], as
/// `F.cross_entropy(logits, targets, ignore_index=-1)`: `logits [n, vocab]`, `targets [n]` →
/// `[1]`. All targets ignored gives `NaN`, as PyTorch does (0 / 0).
pub fn next_token_loss(logits: Tensor<2>, targets: Tensor<1, Int>) -> Tensor<1> {
    let kept = targets.clone().not_equal_elem(IGNORE_INDEX).float().sum();
    log_likelihoods(logits, targets).sum().neg() / kept
}
