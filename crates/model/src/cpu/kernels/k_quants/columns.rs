//! A frozen weight held in a type of GGUF's blocks for training (`[lora] base = "q4_k"`;
//! `cpu/frozen.rs`): each output's inputs as one row of blocks, as a GGUF file stores the
//! matrix, dequantised into training's layout `[n_in, n_out]` when a step needs it.

use std::sync::Arc;

use crate::arch::BlockType;
use crate::cpu::kernels::q8::columns::Int8Columns;

/// Outputs dequantised together: their values land in contiguous runs of the layout.
const TILE: usize = 16;

/// A linear layer's weight `[n_in, n_out]` held as `kind`'s blocks along each output's inputs
/// (`n_out` rows of `n_in`). The values it was made from are what it gives back, always: a row
/// whose blocks do not give its values again (values that are not the type's own rounding)
/// is held in f32 beside the blocks.
#[derive(Debug, Clone)]
pub(crate) struct BlockColumns {
    kind: BlockType,
    n_in: usize,
    n_out: usize,
    /// Shared with a decoder sampling from them ([`BlockColumns::blocks`]).
    bytes: Arc<[u8]>,
    /// Rows held as f32 values: `(output, values [n_in])`.
    exact: Vec<(usize, Vec<f32>)>,
}

impl BlockColumns {
    /// `w [n_in, n_out]` in `kind`'s blocks (`n_in` whole blocks of it).
    pub(crate) fn quantise(w: &[f32], n_in: usize, kind: BlockType) -> Self {
        assert!(n_in.is_multiple_of(kind.values()), "whole blocks");
        let n_out = w.len() / n_in;
        let mut rows = vec![0.0; w.len()];
        for (i, inputs) in w.chunks_exact(n_out).enumerate() {
            for (j, &v) in inputs.iter().enumerate() {
                rows[j * n_in + i] = v;
            }
        }
        let bytes = kind.encode_rows(&rows, n_in);
        let mut back = vec![0.0; n_in];
        let row_bytes = bytes.len() / n_out.max(1);
        let exact = (0..n_out)
            .filter_map(|j| {
                kind.decode(&bytes[j * row_bytes..(j + 1) * row_bytes], &mut back);
                let row = &rows[j * n_in..(j + 1) * n_in];
                let same = back
                    .iter()
                    .zip(row)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                (!same).then(|| (j, row.to_vec()))
            })
            .collect();
        Self {
            kind,
            n_in,
            n_out,
            bytes: bytes.into(),
            exact,
        }
    }

    /// Its blocks and their rows, `n_out` rows of `n_in` values as a GGUF file stores them,
    /// when they alone give its values (`None` where rows are held in f32 beside them).
    pub(crate) fn blocks(&self) -> Option<(BlockType, Arc<[u8]>, usize)> {
        self.exact
            .is_empty()
            .then(|| (self.kind, self.bytes.clone(), self.n_out))
    }

    /// Its values into `out` `[n_in, n_out]` (its allocation reused).
    pub(crate) fn dequantise_into(&self, out: &mut Vec<f32>) {
        let (n_in, n_out) = (self.n_in, self.n_out);
        out.resize(n_in * n_out, 0.0);
        let row_bytes = self.bytes.len() / n_out.max(1);
        let mut tile = vec![0.0; TILE * n_in];
        for j0 in (0..n_out).step_by(TILE) {
            let rows = TILE.min(n_out - j0);
            let bytes = &self.bytes[j0 * row_bytes..(j0 + rows) * row_bytes];
            self.kind.decode(bytes, &mut tile[..rows * n_in]);
            for i in 0..n_in {
                let at = &mut out[i * n_out + j0..i * n_out + j0 + rows];
                for (r, o) in at.iter_mut().enumerate() {
                    *o = tile[r * n_in + i];
                }
            }
        }
        for (j, row) in &self.exact {
            for (i, &v) in row.iter().enumerate() {
                out[i * n_out + j] = v;
            }
        }
    }

    /// Its values as a new `[n_in, n_out]` buffer.
    pub(crate) fn values(&self) -> Vec<f32> {
        let mut out = Vec::new();
        self.dequantise_into(&mut out);
        out
    }

    /// Bytes it holds: the blocks, and any rows held in f32.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.len() + self.exact.iter().map(|(_, r)| 4 * r.len()).sum::<usize>()
    }

    /// Rows held in f32 (the values were not the type's own rounding).
    #[cfg(test)]
    pub(crate) fn exact_rows(&self) -> usize {
        self.exact.len()
    }
}

/// A frozen matrix as a quantised base holds it: `Q8_0` in int8 columns, the other types as
/// their blocks.
#[derive(Debug, Clone)]
pub(crate) enum Frozen {
    Int8(Int8Columns),
    Blocks(BlockColumns),
}

impl Frozen {
    /// `values [n_in, n_out]` held as `kind`.
    pub(crate) fn quantise(values: &[f32], n_in: usize, kind: BlockType) -> Self {
        match kind {
            BlockType::Q8_0 => Frozen::Int8(Int8Columns::quantise(values, n_in)),
            _ => Frozen::Blocks(BlockColumns::quantise(values, n_in, kind)),
        }
    }

    /// Its values into `out` `[n_in, n_out]` (its allocation reused).
    pub(crate) fn dequantise_into(&self, out: &mut Vec<f32>) {
        match self {
            Frozen::Int8(m) => m.dequantise_into(out),
            Frozen::Blocks(m) => m.dequantise_into(out),
        }
    }

    /// Its values as a new `[n_in, n_out]` buffer.
    pub(crate) fn values(&self) -> Vec<f32> {
        match self {
            Frozen::Int8(m) => m.values(),
            Frozen::Blocks(m) => m.values(),
        }
    }

    /// Bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Frozen::Int8(m) => m.bytes(),
            Frozen::Blocks(m) => m.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::quants::rounded;

    /// `[n_in, n_out]` values shaped like a layer's, the same on every run.
    fn layer(n_in: usize, n_out: usize) -> Vec<f32> {
        (0..n_in * n_out)
            .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.1)
            .collect()
    }

    /// Rounded by the type once, the values are held in its blocks alone and come back bit
    /// for bit; values that are not its rounding come back too, from rows kept in f32.
    #[test]
    fn the_values_come_back_exactly() {
        for (kind, n_in) in [(BlockType::Q4_K, 512), (BlockType::Q5_0, 96)] {
            let (n_out, w) = (40, layer(n_in, 40));
            let rounded = rounded(&w, n_in, kind);
            assert!(rounded != w, "{kind:?} rounds");
            let held = BlockColumns::quantise(&rounded, n_in, kind);
            assert!(held.values() == rounded, "{kind:?}");
            assert_eq!(held.exact_rows(), 0, "{kind:?}: its own rounding");
            assert_eq!(
                held.bytes(),
                n_in * n_out / kind.values() * kind.block_bytes()
            );
            // Unrounded values: every row differs from its blocks, so every row is kept.
            let raw = BlockColumns::quantise(&w, n_in, kind);
            assert_eq!(raw.exact_rows(), n_out);
            assert!(raw.values() == w);
        }
    }
}
