//! The head of a step: the LM head's product, the soft cap, the cross-entropy and their
//! backward, a chunk of [`HEAD_ROWS`] rows at a time. The logits of a step are `[rows, vocab]`:
//! at SmolLM2's 49,152 tokens that is 201 MB for one sequence of 1,024, more than the
//! checkpointed blocks' activations. Each chunk's logits become their gradient in place and
//! are multiplied back into the final norm's output gradient before the next chunk is
//! computed, so a thread holds `[HEAD_ROWS, vocab]` of them (the idea of Liger-Kernel's fused
//! linear cross-entropy).

use crate::cpu::buffer::Buffer;
use crate::cpu::dims::Dims;
use crate::cpu::kernels::matmul::{View, matmul};
use crate::cpu::kernels::{cross_entropy, softcap};
use crate::cpu::params::Params;

/// Rows of logits computed at once. 128 keeps each product's shape one the matrix kernel runs
/// near its peak (the head's gradient adds a `[vocab, 128]·[128, width]` product per chunk) in
/// 25 MB at a 49,152-token vocabulary.
pub(crate) const HEAD_ROWS: usize = 128;

/// Floats of logits a thread holds for `rows` rows of a `vocab`-token model: one chunk's.
pub(crate) fn logits_floats(rows: usize, vocab: usize) -> usize {
    rows.min(HEAD_ROWS) * vocab
}

/// What the head reads and writes of a thread's buffers.
pub(super) struct Head<'a> {
    /// The final norm's output `[rows, width]`.
    pub ln_f: &'a [f32],
    pub width: usize,
    /// One chunk's logits, then their gradient: at least `[HEAD_ROWS, vocab]` (fewer rows
    /// when there are).
    pub logits: &'a mut [f32],
    /// With a soft cap, the chunk's `tanh(raw / cap)`: as `logits`; empty without.
    pub capped: &'a mut [f32],
    /// The gradient with respect to `ln_f`, `[rows, width]` (written when asked for).
    pub d_ln_f: &'a mut [f32],
    /// The gradients the head's own are added into.
    pub grads: &'a mut Params,
}

/// The summed negative log-likelihood of `targets` (`[rows]`, [`IGNORE_INDEX`] skipped) under
/// the head of `w` applied to `h.ln_f`. With `grad_scale`, also the gradient of the loss times
/// `grad_scale` with respect to `h.ln_f` into `h.d_ln_f`, and the head's gradient added into
/// `h.grads` where it trains (a frozen head, LoRA's base, has none).
///
/// [`IGNORE_INDEX`]: crate::nn::IGNORE_INDEX
pub(super) fn head(
    h: Head<'_>,
    w: &Params,
    d: &Dims,
    targets: &[i64],
    grad_scale: Option<f32>,
) -> f64 {
    let c = h.width;
    let rows = h.ln_f.len() / c;
    // Tied: the embedding's rows `[vocab, width]` are the head's columns; untied, the head is
    // `[width, vocab]`.
    let (table, tied) = match &w.lm_head {
        Buffer::Absent => (w.wte.values(), true),
        head => (head.values(), false),
    };
    let vocab = table.len() / c;
    let mut loss = 0.0;
    for start in (0..rows).step_by(HEAD_ROWS) {
        let n = HEAD_ROWS.min(rows - start);
        let logits = &mut h.logits[..n * vocab];
        let x = View::new(&h.ln_f[start * c..(start + n) * c], n, c);
        match tied {
            true => matmul(logits, x, View::new(table, vocab, c).t(), false),
            false => matmul(logits, x, View::new(table, c, vocab), false),
        }
        let capped = &mut h.capped[..n * vocab * usize::from(d.softcap > 0.0)];
        if d.softcap > 0.0 {
            softcap::forward(logits, capped, d.softcap);
        }
        // With a gradient asked for, the logits become it here.
        loss += cross_entropy::forward(logits, &targets[start..start + n], grad_scale);
        if grad_scale.is_none() {
            continue;
        }
        if d.softcap > 0.0 {
            softcap::backward_in_place(logits, capped);
        }
        let dl = View::new(logits, n, vocab);
        let d_x = &mut h.d_ln_f[start * c..(start + n) * c];
        match tied {
            true => {
                matmul(d_x, dl, View::new(table, vocab, c), false);
                if let Some(g) = h.grads.wte.get_mut() {
                    matmul(g, dl.t(), x, true);
                }
            }
            false => {
                matmul(d_x, dl, View::new(table, c, vocab).t(), false);
                if let Some(g) = h.grads.lm_head.get_mut() {
                    matmul(g, x.t(), dl, true);
                }
            }
        }
    }
    loss
}
