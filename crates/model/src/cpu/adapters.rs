//! Where LoRA lives in the fused engine's block: an adapter beside each of its four matrices.
//! After the frozen product `y = x · W + b` of `target`'s matrix, [`forward`] adds the
//! adapter's low-rank path `s · ((x ⊙ m) · A) · B` (nothing for a matrix without an adapter)
//! and keeps `(x ⊙ m) · A` for the backward; [`backward`], after the frozen product's backward,
//! adds the adapter's part of the input's gradient and accumulates the gradients of `A` and `B`.
//!
//! The arithmetic is `kernels/lora.rs`; the adapters' factors and scale are `params.rs`'
//! `BlockLora`; their inputs' dropout masks are drawn by `train/workspace.rs`.

use super::kernels::lora;
use super::params::{BlockLora, BlockParams};
use crate::arch::LoraTarget;

/// What a block's adapters keep of its forward for the backward, by [`LoraTarget`].
#[derive(Debug, Default)]
pub(super) struct AdapterActs {
    /// Each adapted matrix's (dropped) input times its `A`, `[rows, rank]` (empty: no adapter).
    pub xa: [Vec<f32>; 4],
    /// With `[lora] dropout`: the scales on each adapted matrix's input, `[rows, n_in]`
    /// (empty: none).
    pub mask: [Vec<f32>; 4],
}

impl AdapterActs {
    /// The buffers, for counting what they hold.
    pub(super) fn buffers(&self) -> impl Iterator<Item = &Vec<f32>> {
        self.xa.iter().chain(&self.mask)
    }
}

/// The adapter on `target`'s matrix of `p` as the LoRA kernels take it: `A`, `B`, scale;
/// `None` when that matrix has none.
fn adapter(p: &BlockParams, target: LoraTarget) -> Option<(&[f32], &[f32], f32)> {
    let ad = p.lora.get(target);
    Some((ad.a.get()?, ad.b.values(), p.lora.scale))
}

/// `out [rows, n_out] += s · ((x ⊙ m) · A) · B` for the adapter on `target`'s matrix of `p`
/// (`x [rows, n_in]` that matrix's input), keeping `(x ⊙ m) · A` in `acts`; `dims` is
/// `(rows, n_in, n_out)`.
pub(super) fn forward(
    p: &BlockParams,
    acts: &mut AdapterActs,
    target: LoraTarget,
    out: &mut [f32],
    x: &[f32],
    dims: (usize, usize, usize),
) {
    let Some(adapter) = adapter(p, target) else {
        return;
    };
    let t = target as usize;
    let input = (x, &acts.mask[t][..]);
    lora::forward(out, &mut acts.xa[t], input, adapter, dims);
}

/// The backward of [`forward`]: `dx` holds the frozen product's part of the input's gradient
/// and gains the adapter's; the gradients of `A` and `B` go into `g`. `(dy, x)` are the
/// output's gradient and the input; `t` is scratch.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    p: &BlockParams,
    g: &mut BlockLora,
    acts: &AdapterActs,
    t: &mut Vec<f32>,
    target: LoraTarget,
    dx: &mut [f32],
    (dy, x): (&[f32], &[f32]),
    dims: (usize, usize, usize),
) {
    let Some(adapter) = adapter(p, target) else {
        return;
    };
    let k = target as usize;
    let grads = g.get_mut(target);
    let grads = (grads.a.values_mut(), grads.b.values_mut());
    let input = (x, &acts.mask[k][..]);
    lora::backward(dx, grads, t, dy, input, &acts.xa[k], adapter, dims);
}
