//! A `[rows, cols]` matrix of an adapter's factors, as PEFT and tinygpt lay them out.

use std::ops::Range;

use anyhow::{Result, bail};

use crate::interop::foreign::{Foreign, NamedTensor};

/// A `[rows, cols]` matrix of f32 values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub values: Vec<f32>,
}

impl Matrix {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            values: vec![0.0; rows * cols],
        }
    }

    pub fn at(&self, r: usize, c: usize) -> f32 {
        self.values[r * self.cols + c]
    }

    pub(crate) fn transposed(&self) -> Self {
        let mut t = Self::zeros(self.cols, self.rows);
        for r in 0..self.rows {
            for c in 0..self.cols {
                t.values[c * self.rows + r] = self.at(r, c);
            }
        }
        t
    }

    /// `self` written into `into` at row `row`, column `col`, each value times `scale`.
    pub fn place(&self, into: &mut Matrix, row: usize, col: usize, scale: f32) {
        for r in 0..self.rows {
            for c in 0..self.cols {
                into.values[(row + r) * into.cols + col + c] = self.at(r, c) * scale;
            }
        }
    }

    pub fn columns(&self, range: Range<usize>) -> Self {
        let mut out = Self::zeros(self.rows, range.len());
        for r in 0..self.rows {
            for (i, c) in range.clone().enumerate() {
                out.values[r * out.cols + i] = self.at(r, c);
            }
        }
        out
    }

    pub fn named(self, name: String) -> NamedTensor {
        let bytes = self.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        (name, vec![self.rows, self.cols], bytes)
    }

    pub(crate) fn from_foreign(name: &str, t: Foreign) -> Result<Self> {
        match t.shape[..] {
            [rows, cols] => Ok(Self {
                rows,
                cols,
                values: t.values,
            }),
            _ => bail!("tensor `{name}` has shape {:?}, not a matrix", t.shape),
        }
    }
}
