//! Rotary position embeddings (RoPE; Su et al. 2021, used by Llama and nanochat): a position
//! enters attention by *rotating* each query and key, instead of adding a learned vector to the
//! input as GPT-2 does.
//!
//! A head's `d_head` channels are taken in pairs, and pair `i` of the vector at position `m` is
//! turned by the angle `m·θᵢ`, with `θᵢ = base^(-2i/d_head)` (`base` = 10000 in GPT-NeoX and
//! Llama 2, 500000 in Llama 3): fast turns for the first pairs, slow for the last.
//!
//! ```text
//! x'ᵢ       = xᵢ·cos(mθᵢ) − xᵢ₊d/2·sin(mθᵢ)          x' = x·cos + rotate_half(x)·sin
//! x'ᵢ₊d/2   = xᵢ₊d/2·cos(mθᵢ) + xᵢ·sin(mθᵢ)          rotate_half([a, b]) = [−b, a]
//! ```
//!
//! The layer computes `rotate_half(x)·sin` as `swap_halves(x)·sin±`, the sign of the first half
//! folded into a second sine table ([`signed_sines`]): the same numbers, and the halves moved by
//! one flip, whose gradient is one flip, where `rotate_half`'s two slices and `cat` give back,
//! for each half, zeros written and then assigned into (four launches a rotation on a GPU).
//!
//! Channel `i` is paired with `i + d_head/2` (the two halves of the head): Hugging Face's
//! `rotate_half` layout, the one Llama-family checkpoints are trained with, so their weights
//! import without permuting. Burn's `RotaryEncoding` pairs neighbours `(2i, 2i+1)` instead: the
//! same rotations of permuted channels (a test here shows it).
//!
//! Why it encodes *relative* position, which is what attention needs:
//! - a rotation keeps a vector's length, so it never changes how strongly a query asks or a key
//!   answers, only the direction;
//! - rotating the query at position `m` by `mθ` and the key at position `n` by `nθ` gives
//!   `q'·k' = q·R((n−m)θ)·k`: the score depends on the distance `n − m`, not on where the pair
//!   sits in the sequence.
//!
//! Both are tested. Nothing here is learned: the tables are fixed by `base` and `d_head`.

use std::ops::Range;

use burn::tensor::{Device, Tensor, TensorData};

use crate::error::AttentionConfigError;

/// The cosines and sines of every position's angles, `[max_seq, d_head]` each, in the
/// `rotate_half` layout (the angles of pairs `0..d/2` written twice: `cat(angles, angles)`);
/// the sines kept with their first half negated ([`signed_sines`]), what [`swap_halves`] is
/// multiplied by.
#[derive(Debug, Clone)]
pub struct RopeTables {
    pub cos: Tensor<2>,
    pub(crate) signed_sin: Tensor<2>,
}

impl RopeTables {
    /// The tables for positions `0..max_seq` of heads `d_head` wide (even) with `base` (> 0),
    /// computed in f64 and stored in f32.
    pub fn new(
        max_seq: usize,
        d_head: usize,
        base: f64,
        device: &Device,
    ) -> Result<Self, AttentionConfigError> {
        if d_head == 0 || !d_head.is_multiple_of(2) {
            return Err(AttentionConfigError::RopeOddHead { d_head });
        }
        if !(base.is_finite() && base > 0.0) {
            return Err(AttentionConfigError::RopeBase(base));
        }
        let (cos, sin) = angles(0..max_seq, d_head, base);
        let table = |values: Vec<f32>| {
            Tensor::<2>::from_data(TensorData::new(values, [max_seq, d_head]), device)
        };
        Ok(Self {
            cos: table(cos),
            signed_sin: table(signed_sines(&sin, d_head)),
        })
    }

    /// Positions the tables cover.
    pub fn max_seq(&self) -> usize {
        self.cos.dims()[0]
    }

    /// `x` `[batch, heads, seq, d_head]` whose rows sit at positions `offset..offset + seq`,
    /// each rotated by its position's angles: `x·cos + rotate_half(x)·sin` (as
    /// `swap_halves(x)·sin±`, see the module). Panics if the
    /// positions run past [`RopeTables::max_seq`] (the layer checks lengths first).
    pub fn apply(&self, x: Tensor<4>, offset: usize) -> Tensor<4> {
        let [_, _, seq, d_head] = x.dims();
        let rows = |table: &Tensor<2>| {
            table
                .clone()
                .slice([offset..offset + seq, 0..d_head])
                .reshape([1, 1, seq, d_head])
                .cast(x.dtype())
        };
        let (cos, signed_sin) = (rows(&self.cos), rows(&self.signed_sin));
        x.clone() * cos + swap_halves(x) * signed_sin
    }
}

/// The cosines and sines for positions `positions` (`[positions.len(), d_head]` each, row-major,
/// the `rotate_half` layout), computed in f64 and rounded to f32 once: the tables the layer and
/// tinygpt's CPU engine both read, so the two rotate by the very same numbers. `d_head` even.
pub fn angles(positions: Range<usize>, d_head: usize, base: f64) -> (Vec<f32>, Vec<f32>) {
    let half = d_head / 2;
    let rates: Vec<f64> = (0..half)
        .map(|i| base.powf(-2.0 * i as f64 / d_head as f64))
        .collect();
    let n = positions.len() * d_head;
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for m in positions {
        for c in 0..d_head {
            let angle = m as f64 * rates[c % half];
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// The rotation of `seq` rows at positions `offset..offset + seq`: their cosines and sines as
/// `[1, 1, seq, d_head]` tensors on `device`, computed once and applied to the queries and the
/// keys alike ([`RopeRows::apply`]). Cheaper than keeping [`RopeTables`] for the whole context
/// when the rows are few, and no more than the attention that follows when they are many.
#[derive(Debug, Clone)]
pub struct RopeRows {
    pub(crate) cos: Tensor<4>,
    /// The sines with the first half negated ([`signed_sines`]).
    pub(crate) signed_sin: Tensor<4>,
}

impl RopeRows {
    /// Rows already made, `cos` and `signed_sin` `[rows, 1, new, d_head]` (a decode step
    /// selects them from [`RopeTables`] on the device).
    pub(crate) fn from_rows(cos: Tensor<4>, signed_sin: Tensor<4>) -> Self {
        Self { cos, signed_sin }
    }

    /// Rows from the tables' values `cos` and `sin` (each `[shape]`, rows of `d_head`).
    fn from_values(cos: Vec<f32>, sin: Vec<f32>, shape: [usize; 4], device: &Device) -> Self {
        let d_head = shape[3];
        let rows =
            |values: Vec<f32>| Tensor::<4>::from_data(TensorData::new(values, shape), device);
        Self {
            cos: rows(cos),
            signed_sin: rows(signed_sines(&sin, d_head)),
        }
    }

    /// The rows of `d_head`-wide (even) heads with base `base`.
    pub fn new(offset: usize, seq: usize, d_head: usize, base: f64, device: &Device) -> Self {
        let (cos, sin) = angles(offset..offset + seq, d_head, base);
        Self::from_values(cos, sin, [1, 1, seq, d_head], device)
    }

    /// The rotation of one row per sequence of a batch, sequence `r`'s at `positions[r]`
    /// (continuous batching: the sequences have different lengths): `[rows, 1, 1, d_head]`
    /// tensors, applied to `[rows, heads, 1, d_head]`.
    pub fn at(positions: &[usize], d_head: usize, base: f64, device: &Device) -> Self {
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for &p in positions {
            let (c, s) = angles(p..p + 1, d_head, base);
            cos.extend(c);
            sin.extend(s);
        }
        Self::from_values(cos, sin, [positions.len(), 1, 1, d_head], device)
    }

    /// `x` `[batch, heads, seq, d_head]`, rotated: `x·cos + rotate_half(x)·sin` (as
    /// `swap_halves(x)·sin±`, see the module).
    pub fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let dtype = x.dtype();
        let (cos, signed_sin) = (self.cos.clone(), self.signed_sin.clone());
        x.clone() * cos.cast(dtype) + swap_halves(x) * signed_sin.cast(dtype)
    }
}

/// Rows of `d_head` sines with the first half of each negated: `rotate_half(x)·sin` is
/// `swap_halves(x)·signed_sines(sin)`, since `rotate_half([a, b]) = [−b, a]` and
/// `swap_halves([a, b]) = [b, a]`.
pub fn signed_sines(sin: &[f32], d_head: usize) -> Vec<f32> {
    sin.chunks(d_head)
        .flat_map(|row| {
            let (first, second) = row.split_at(d_head / 2);
            first.iter().map(|s| -s).chain(second.iter().copied())
        })
        .collect()
}

/// `[a, b] → [b, a]` over the last axis, `a` and `b` its two halves: the last axis seen as
/// `[2, d/2]` (a view) and flipped. Shape kept: `[batch, heads, seq, d_head]` (or any
/// `[.., .., .., d_head]`: the packed heads').
pub fn swap_halves(x: Tensor<4>) -> Tensor<4> {
    let [b, h, s, d] = x.dims();
    x.reshape([b, h, s, 2, d / 2])
        .flip([3])
        .reshape([b, h, s, d])
}

/// `[a, b] → [−b, a]` over the last axis, `a` and `b` its two halves: a quarter turn of every
/// pair `(i, i + d/2)`. Shape kept: `[batch, heads, seq, d_head]`.
pub fn rotate_half(x: Tensor<4>) -> Tensor<4> {
    let [b, h, s, d] = x.dims();
    let first = x.clone().slice([0..b, 0..h, 0..s, 0..d / 2]);
    let second = x.slice([0..b, 0..h, 0..s, d / 2..d]);
    Tensor::cat(vec![second.neg(), first], 3)
}
