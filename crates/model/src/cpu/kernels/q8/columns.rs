//! A frozen weight held in `Q8_0` for training (`[lora] base = "q8_0"`; `cpu/frozen.rs`):
//! GGUF's blocks of 32 along each output's inputs, stored in training's layout.

use half::f16;

use super::Q8Matrix;
use crate::arch::q8_0::{BLOCK, quantize_block};

/// A linear layer's weight `[n_in, n_out]` rounded to `Q8_0` in blocks of 32 along each
/// output's inputs (as GGUF's rows hold it), stored in training's layout: the bytes
/// `[n_in, n_out]` and each block's f16 scale `[n_in / 32, n_out]`, so that a row of the
/// weight dequantises from contiguous bytes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Int8Columns {
    n_out: usize,
    q: Vec<i8>,
    d: Vec<f16>,
}

impl Int8Columns {
    /// `w [n_in, n_out]` quantised as ggml's reference quantiser does it (`n_in` whole
    /// blocks).
    pub(crate) fn quantise(w: &[f32], n_in: usize) -> Self {
        assert!(n_in.is_multiple_of(BLOCK), "a Q8_0 block is 32 inputs");
        let n_out = w.len() / n_in;
        let mut m = Self {
            n_out,
            q: vec![0; w.len()],
            d: vec![f16::ZERO; w.len() / BLOCK],
        };
        let (mut x, mut q) = ([0.0; BLOCK], [0i8; BLOCK]);
        for b in 0..n_in / BLOCK {
            for j in 0..n_out {
                let at = |k: usize| (b * BLOCK + k) * n_out + j;
                x.iter_mut().enumerate().for_each(|(k, v)| *v = w[at(k)]);
                m.d[b * n_out + j] = f16::from_f32(quantize_block(&x, &mut q));
                q.iter().enumerate().for_each(|(k, &q)| m.q[at(k)] = q);
            }
        }
        m
    }

    /// Its values `q · d` into `out` `[n_in, n_out]` (its allocation reused).
    pub(crate) fn dequantise_into(&self, out: &mut Vec<f32>) {
        out.resize(self.q.len(), 0.0);
        let n = self.n_out;
        let mut scales = vec![0.0f32; n];
        let rows = out
            .chunks_exact_mut(BLOCK * n)
            .zip(self.q.chunks_exact(BLOCK * n));
        for (b, (out, q)) in rows.enumerate() {
            let d = &self.d[b * n..(b + 1) * n];
            scales.iter_mut().zip(d).for_each(|(s, d)| *s = d.to_f32());
            for (out, q) in out.chunks_exact_mut(n).zip(q.chunks_exact(n)) {
                for ((o, &q), s) in out.iter_mut().zip(q).zip(&scales) {
                    *o = f32::from(q) * s;
                }
            }
        }
    }

    /// Its values as a new `[n_in, n_out]` buffer.
    pub(crate) fn values(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.dequantise_into(&mut out);
        out
    }

    /// The same blocks as the decoder's rows of outputs (`n_out` rows of `n_in`): a copy in
    /// its layout, no value rounded again.
    pub(crate) fn rows(&self) -> Q8Matrix {
        let n = self.n_out;
        let n_in = self.q.len() / n.max(1);
        let mut m = Q8Matrix::zeros(n, n_in);
        for j in 0..n {
            let (q, d) = m.row_mut(j);
            q.iter_mut()
                .enumerate()
                .for_each(|(i, q)| *q = self.q[i * n + j]);
            d.iter_mut()
                .enumerate()
                .for_each(|(b, d)| *d = self.d[b * n + j]);
        }
        m
    }

    /// Bytes it holds: a byte a weight, two a block's scale.
    pub(crate) fn bytes(&self) -> usize {
        self.q.len() + 2 * self.d.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::q8_0::round_columns;

    /// The int8 copy computes with the `Q8_0` rounding of the weight (what Burn's model holds
    /// once its adapters are attached), and quantising those values again gives the same
    /// bytes and scales: values of every magnitude, a zero block, a largest value negative.
    #[test]
    fn the_int8_copy_holds_the_rounding_and_rounds_to_itself() {
        let (n_in, n_out) = (4 * BLOCK, 7);
        let mut w: Vec<f32> = (0..n_in * n_out)
            .map(|i| ((i * 7919 % 251) as f32 / 50.0 - 2.5) * 10f32.powi(i as i32 % 9 - 5))
            .collect();
        (0..BLOCK).for_each(|i| w[i * n_out + 2] = 0.0);
        w[5 * n_out + 3] = -40.0;
        let mut rounded = w.clone();
        round_columns(&mut rounded, n_in);
        assert_ne!(rounded, w);
        let m = Int8Columns::quantise(&w, n_in);
        assert_eq!(m.values(), rounded);
        let again = Int8Columns::quantise(&rounded, n_in);
        assert_eq!((&again.q, &again.d), (&m.q, &m.d));
        assert_eq!(m.bytes(), n_in * n_out * 34 / 32);
    }
}
