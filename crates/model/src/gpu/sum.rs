//! The sum of every element of a long tensor, in stages that give the right answer on every
//! device.
//!
//! Burn 0.22.1's whole-tensor reduction on wgpu (seen on Mesa's lavapipe) drops the elements
//! past the first 2^18 of a reduced axis: `sum()` of a million ones gives 262,132, `max()` of
//! a tensor whose ones all lie past index 2^18 gives 0, while every element-wise kernel and
//! short rows read the whole buffer. A model's gradient norm sums millions of squares, so on
//! wgpu it came out small (2.97 for the CPU's 13.74 at shakespeare-char's size), clipping let
//! through what it should have scaled, and a non-finite gradient past 2^18 would have passed
//! the step's guard. [`sum_all`] reduces rows of [`ROW`] elements, then the rows' sums, so no
//! reduction ever spans more than [`ROW`] elements: right on wgpu, and on a real GPU many rows
//! reduce in parallel instead of one long axis.

use burn::tensor::Tensor;

/// Elements one stage sums per row: far below the 2^18 a reduced axis may safely span, and
/// enough that a stage shrinks 10 million elements to ten thousand.
pub const ROW: usize = 1024;

/// The sum of all of `x`'s elements, `[1]`, on `x`'s device: sums of rows of [`ROW`], then of
/// those, until one row is left (see the module docs). `x`: `[n]`.
pub fn sum_all(x: Tensor<1>) -> Tensor<1> {
    let mut x = x;
    loop {
        let n = x.dims()[0];
        if n <= ROW {
            return x.sum();
        }
        let whole = n / ROW * ROW;
        let rows = x
            .clone()
            .slice(0..whole)
            .reshape([whole / ROW, ROW])
            .sum_dim(1)
            .reshape([whole / ROW]);
        x = match whole == n {
            true => rows,
            false => Tensor::cat(vec![rows, x.slice(whole..n)], 0),
        };
    }
}
