//! Rotary positions on the CPU, forward and backward: each head's query and key are turned by
//! their position's angles (`tinygpt_attention::rope`, Hugging Face's `rotate_half` layout:
//! channel `i` paired with `i + d/2`). The backward turns the gradients back: a rotation's
//! transpose is its inverse.

use tinygpt_attention::rope::angles;

/// The cosines and sines of positions `0..len`, `[len, d_head]` each (the angles of pairs
/// `0..d/2` written twice), from the same function the Burn layer reads.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tables {
    cos: Vec<f32>,
    sin: Vec<f32>,
    d_head: usize,
}

impl Tables {
    pub(crate) fn new(len: usize, d_head: usize, base: f64) -> Self {
        let (cos, sin) = angles(0..len, d_head, base);
        Self { cos, sin, d_head }
    }

    /// Whether no tables were made (a model without rotary positions).
    pub(crate) fn is_empty(&self) -> bool {
        self.cos.is_empty()
    }

    /// Rotates every head-wide piece of `x` (`[n·d_head]`, the query and key heads of one row)
    /// by position `m`'s angles; `inverse` turns the other way (the backward).
    pub(crate) fn rotate(&self, x: &mut [f32], m: usize, inverse: bool) {
        let d = self.d_head;
        let half = d / 2;
        let (cos, sin) = (
            &self.cos[m * d..m * d + half],
            &self.sin[m * d..m * d + half],
        );
        let sign = if inverse { -1.0 } else { 1.0 };
        for head in x.chunks_exact_mut(d) {
            let (a, b) = head.split_at_mut(half);
            for (((a, b), &c), &s) in a.iter_mut().zip(b.iter_mut()).zip(cos).zip(sin) {
                let s = sign * s;
                let (x0, x1) = (*a, *b);
                *a = x0 * c - x1 * s;
                *b = x1 * c + x0 * s;
            }
        }
    }
}
