//! The decode step a GPU runs for every new token: one token per row (or a fixed number of a
//! prompt's tokens per row), and everything that changes from one token to the next (its
//! position, the cache row it writes, the keys it may see, its rotation) a device tensor, never
//! a number in a kernel's launch.
//!
//! [`CausalSelfAttention::forward_cached`](crate::CausalSelfAttention::forward_cached) with a
//! fixed cache already runs the same shapes for every token, but the position still reaches
//! the kernels as launch arguments: the row a cache write starts at, the causal mask built
//! for it, the rotation angles computed on the host and uploaded. Here the host hands over the
//! positions once per token ([`StepAt::new`]) and the device derives the rest from them:
//!
//! ```text
//! hidden[r, i, j] = j > position[r, i]             compare with 0..capacity   [rows, 1, new, capacity]
//! cos, sin        = tables[position[r, i]]         select                     [rows, 1, new, d_head]
//! cache[r, :, position[r, i], :] = k[r, :, i, :]   scatter along the rows     [rows, kv, capacity, d_head]
//! ```
//!
//! So a step's launches are the same, argument for argument, at every position: what a
//! captured GPU graph can replay, with only the contents of the position buffer changing. Each
//! row is its own sequence (a server's streams); one stream is `rows = 1`.
//!
//! A prompt goes in the same way, `new` tokens a row at once ([`StepAt::tokens`]): a row's
//! tokens sit at consecutive positions after its cache, each hidden from the keys after its
//! own position, so within the chunk the mask is the causal triangle and before it the cache
//! is seen whole. A chunk shorter than `new` repeats its last token at its last position: the
//! repeats compute exactly that token's key and value again and write them where it writes
//! them, so the step keeps its shape whatever the prompt's length, and a row's last token is
//! always its last real one.

use burn::tensor::{Bool, Device, IndexingUpdateOp, Int, Tensor, TensorData};

use crate::decode_attention;
use crate::error::AttentionError;
use crate::kernels::Kernels;
use crate::kv_cache::KvCache;
use crate::rope::{RopeRows, RopeTables};

/// What every step of a layer stack shares, made once per decoder: the key positions
/// `0..capacity` to compare with, the rotation tables when the layers rotate, and how the
/// layers attend.
#[derive(Debug, Clone)]
pub struct StepTables {
    /// `[capacity]`: `0, 1, …, capacity - 1`.
    keys: Tensor<1, Int>,
    rope: Option<RopeTables>,
    /// Whether the layers attend in one kernel ([`crate::decode_attention`]) rather than with
    /// tensor ops over a mask: decided here, once.
    kernel: bool,
}

impl StepTables {
    /// Tables for caches of `capacity` rows and heads `d_head` wide, with rotary base
    /// `rope_base` when the layers rotate (a layer's [`CausalSelfAttention::rope_base`]), on
    /// `device`, for layers running `kernels` (their decode steps attend in the
    /// decode-attention kernel where it [`applies`](decode_attention::applies) and gradients
    /// are not tracked).
    ///
    /// [`CausalSelfAttention::rope_base`]: crate::CausalSelfAttention::rope_base
    pub fn new(
        capacity: usize,
        d_head: usize,
        rope_base: Option<f64>,
        kernels: Kernels,
        device: &Device,
    ) -> Self {
        Self {
            kernel: decode_attention::applies(kernels, capacity) && !device.is_autodiff(),
            keys: Tensor::arange(0..capacity as i64, device),
            // The base and head size were validated when the layer was built.
            rope: rope_base.map(|base| {
                RopeTables::new(capacity, d_head, base, device).expect("a layer's rotary settings")
            }),
        }
    }

    /// Rows of the caches the steps write.
    pub fn capacity(&self) -> usize {
        self.keys.dims()[0]
    }
}

/// What a layer's attention reads to hide the keys past each token's position.
#[derive(Debug, Clone)]
pub(crate) enum Seen {
    /// `[rows, 1, new, capacity]`, `true` past each token's position: the mask of the
    /// attention written as tensor ops.
    Hidden(Tensor<4, Bool>),
    /// `[rows, new]`, the positions in f32: the decode-attention kernel compares them itself
    /// ([`crate::decode_attention`]).
    Positions(Tensor<2>),
}

/// Where this step's rows are, as device tensors every layer reads: the positions, the keys
/// each row's tokens may see, their rotation.
#[derive(Debug, Clone)]
pub struct StepAt {
    /// `[rows, new]`.
    positions: Tensor<2, Int>,
    /// The keys each token may see.
    seen: Seen,
    /// Keys in the caches the step reads.
    capacity: usize,
    rope: Option<RopeRows>,
    /// The positions on the host, `[rows * new]` row by row, for the checks and the caches'
    /// lengths.
    host: Vec<usize>,
    /// Tokens each row feeds.
    new: usize,
}

impl StepAt {
    /// Row `r`'s new token at `positions[r]` (below the tables' capacity): one upload, then
    /// the mask and the rotation derived on the device.
    pub fn new(tables: &StepTables, positions: &[usize]) -> Result<Self, AttentionError> {
        Self::tokens(tables, positions, 1)
    }

    /// `new` tokens a row (a prompt's chunk), row `r`'s at `positions[r * new..(r + 1) * new]`,
    /// each below the tables' capacity.
    pub fn tokens(
        tables: &StepTables,
        positions: &[usize],
        new: usize,
    ) -> Result<Self, AttentionError> {
        let ids: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
        let rows = positions.len() / new.max(1);
        let device = tables.keys.device();
        let at = Tensor::<2, Int>::from_data(TensorData::new(ids, [rows, new]), &device);
        Self::tokens_on_device(tables, at, positions)
    }

    /// [`StepAt::new`] from positions already on the device, `[rows]` (a buffer a captured
    /// step reads; `host` holds the same numbers, for the checks and the caches' lengths).
    pub fn on_device(
        tables: &StepTables,
        at: Tensor<1, Int>,
        host: &[usize],
    ) -> Result<Self, AttentionError> {
        let rows = at.dims()[0];
        Self::tokens_on_device(tables, at.reshape([rows, 1]), host)
    }

    /// [`StepAt::tokens`] from positions already on the device, `[rows, new]`.
    pub fn tokens_on_device(
        tables: &StepTables,
        at: Tensor<2, Int>,
        host: &[usize],
    ) -> Result<Self, AttentionError> {
        let capacity = tables.capacity();
        if let Some(&p) = host.iter().find(|&&p| p >= capacity) {
            return Err(AttentionError::SequenceTooLong {
                len: p + 1,
                max: capacity,
            });
        }
        let [rows, new] = at.dims();
        if host.is_empty() || new == 0 {
            return Err(AttentionError::EmptySequence);
        }
        let seen = match tables.kernel {
            true => Seen::Positions(at.clone().float()),
            false => Seen::Hidden(
                tables
                    .keys
                    .clone()
                    .reshape([1, 1, capacity])
                    .expand([rows, new, capacity])
                    .greater(
                        at.clone()
                            .reshape([rows, new, 1])
                            .expand([rows, new, capacity]),
                    )
                    .reshape([rows, 1, new, capacity]),
            ),
        };
        let rope = tables.rope.as_ref().map(|t| {
            let d_head = t.cos.dims()[1];
            let row = |table: &Tensor<2>| {
                table
                    .clone()
                    .select(0, at.clone().reshape([rows * new]))
                    .reshape([rows, 1, new, d_head])
            };
            RopeRows::from_rows(row(&t.cos), row(&t.signed_sin))
        });
        Ok(Self {
            positions: at,
            seen,
            capacity,
            rope,
            host: host.to_vec(),
            new,
        })
    }

    /// Rows of the step.
    pub fn rows(&self) -> usize {
        self.host.len() / self.new
    }

    /// Tokens each row feeds.
    pub fn tokens_per_row(&self) -> usize {
        self.new
    }

    /// `[rows, new]` on the device.
    pub fn positions(&self) -> Tensor<2, Int> {
        self.positions.clone()
    }

    pub(crate) fn rope(&self) -> Option<&RopeRows> {
        self.rope.as_ref()
    }

    /// What the layers read to hide the keys past each token's position.
    pub(crate) fn seen(&self) -> &Seen {
        &self.seen
    }

    /// Keys in the caches the step reads.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// The positions on the host, `[rows * new]`.
    pub(crate) fn host(&self) -> &[usize] {
        &self.host
    }
}

impl KvCache {
    /// Writes `keys` and `values` `[rows, kv_heads, new, d_head]` at row `r`'s positions
    /// `positions[r]` (`[rows, new]` on the device; `host` the same positions) of this fixed
    /// cache, in place, and returns the whole buffers `[rows, kv_heads, capacity, d_head]`. The
    /// cache's length becomes the last position + 1 (one sequence: `rows = 1`).
    pub(crate) fn write_at(
        &mut self,
        keys: Tensor<4>,
        values: Tensor<4>,
        positions: &Tensor<2, Int>,
        host: &[usize],
    ) -> Result<(Tensor<4>, Tensor<4>), AttentionError> {
        let [rows, heads, new, d_head] = keys.dims();
        let capacity = self.capacity().unwrap_or(0);
        if let Some(cached) = self.batch()
            && cached != rows
        {
            return Err(AttentionError::CacheBatchMismatch { cached, got: rows });
        }
        let index = positions
            .clone()
            .reshape([rows, 1, new, 1])
            .expand([rows, heads, new, d_head]);
        let full = [rows, heads, capacity, d_head];
        let write = |buffer: Option<Tensor<4>>, rows: Tensor<4>| {
            let buffer = match buffer {
                Some(buffer) if buffer.dims() == full => buffer,
                _ => Tensor::<4>::zeros(full, (&rows.device(), rows.dtype())),
            };
            buffer.scatter(2, index.clone(), rows, IndexingUpdateOp::Assign)
        };
        let (old_keys, old_values) = self.take_buffers();
        let keys = write(old_keys, keys);
        let values = write(old_values, values);
        let len = host.iter().max().map_or(0, |&p| p + 1);
        self.set_buffers(keys.clone(), values.clone(), len);
        Ok((keys, values))
    }
}
