//! # Flash attention: the same attention, without the `[seq, seq]` matrix in memory
//!
//! The explicit path computes the scores `Q Kᵀ`, masks them, takes the softmax and multiplies
//! by `V` as four separate steps, writing `[batch, heads, seq, seq]` values to memory between
//! each — and the backward reads them all again. Flash attention (Dao et al., 2022) computes the
//! same output in one kernel: each query row walks the keys block by block and keeps a *running*
//! softmax — the largest score so far `m`, the sum of exponentials `l` and the weighted sum of
//! values `acc` — rescaling `l` and `acc` by `exp(m_old - m_new)` whenever a larger score
//! appears. At the end `out = acc / l`, exactly the softmax-weighted sum. The causal mask becomes
//! a loop bound: blocks of keys after the query are never loaded, and the diagonal block stops
//! at the query itself, so a hidden key gets exactly zero weight without a `-inf` ever being
//! written.
//!
//! The forward also returns each row's log-sum-exp, `lse = m + ln l`. The backward uses it to
//! rebuild any weight from its score alone, `p_ij = exp(q_i·k_j/√d - lse_i)`, instead of storing
//! the weights: it recomputes the scores and produces `dQ`, `dK` and `dV`
//! ([`kernels`] has both passes side by side).
//!
//! Dropout on the attention weights happens inside the kernel: whether weight `(i, j)` is kept
//! is a hash of the call's seed and the position, so the backward recomputes the same mask. The
//! seeds come from [`seed_dropout`]: one seed per training step gives the same masks every time
//! the step is run.
//!
//! The kernels are CubeCL, so one source runs on every GPU backend Burn has (wgpu, Vulkan, CUDA);
//! they are a Burn *backend extension* with a hand-written backward for autodiff. A layer built
//! on another backend (a CPU one: [`Kernels::Burn`]) takes the explicit path ([`supported`]).

mod autodiff;
mod cube;
pub mod kernels;

use std::sync::atomic::{AtomicU64, Ordering};

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{DType, Shape, Tensor};

use crate::kernels::Kernels;

/// Rows per block (units per cube); smaller when two tiles of them do not fit in shared memory.
pub(crate) const MAX_BLOCK: usize = 32;

/// The widest head the kernels take: each unit keeps four rows of `d_head` values in registers.
pub const MAX_D_HEAD: usize = 256;

/// Flash attention as a backend operation: the forward `(out, lse)` and the backward
/// `(dQ, dK, dV)`, all `[batch, heads, seq, d_head]` (`lse`: `[batch, heads, seq]`).
///
/// Implemented for Burn's CubeCL backend, lazily under its kernel fusion, and for autodiff with
/// the backward wired by hand. Use [`flash_attention`].
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait FlashAttentionBackend: Backend {
    /// `softmax(q kᵀ/√d_head + causal mask)` with dropout `dropout` (mask from `seed`), times
    /// `v`; and the log-sum-exp of each row's scaled scores.
    #[fusion(meta = |q, _k, _v, _dropout, _seed| (q.clone(), row_spec(q)))]
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradients of `q`, `k` and `v` given the forward's `out` and `lse` and the output's
    /// gradient `d_out`, with the forward's dropout and seed.
    #[fusion(meta = |q, k, v, _out, _lse, _d_out, _dropout, _seed| {
        (q.clone(), k.clone(), v.clone())
    })]
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// [`flash_attention_forward`](Self::flash_attention_forward) reading the queries, keys
    /// and values where the projection wrote them, side by side in `qkv` `[batch, seq,
    /// (heads + 2·kv_heads)·d_head]`, and writing the output as the next projection reads it,
    /// `[batch, seq, heads·d_head]`; `lse` as before.
    #[fusion(meta = |qkv, heads, kv_heads, _dropout, _seed| packed_specs(qkv, *heads, *kv_heads))]
    fn flash_attention_packed_forward(
        qkv: FloatTensor<Self>,
        heads: u32,
        kv_heads: u32,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The gradient of `qkv` (its shape: dQ, dK and dV in their columns) given the packed
    /// forward's `out`, `lse` and the output's gradient `d_out` (`[batch, seq, heads·d_head]`).
    #[fusion(dtype = qkv, shape = qkv)]
    #[allow(clippy::too_many_arguments)]
    fn flash_attention_packed_backward(
        qkv: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        heads: u32,
        kv_heads: u32,
        dropout: f32,
        seed: u32,
    ) -> FloatTensor<Self>;
}

/// The packed forward's `(out, lse)` for `qkv` `[batch, seq, (heads + 2·kv_heads)·d_head]`:
/// `[batch, seq, heads·d_head]` and `[batch, heads, seq]`.
fn packed_specs(qkv: &TensorSpec, heads: u32, kv_heads: u32) -> (TensorSpec, TensorSpec) {
    let (heads, kv_heads) = (heads as usize, kv_heads as usize);
    let [batch, seq, width] = [qkv.shape[0], qkv.shape[1], qkv.shape[2]];
    let d_head = width / (heads + 2 * kv_heads);
    (
        TensorSpec::new(Shape::new([batch, seq, heads * d_head]), qkv.dtype),
        TensorSpec::new(Shape::new([batch, heads, seq]), qkv.dtype),
    )
}

/// `[batch, heads, seq, d_head]` -> the per-row `[batch, heads, seq]`.
fn row_spec(q: &TensorSpec) -> TensorSpec {
    TensorSpec::new(Shape::new([q.shape[0], q.shape[1], q.shape[2]]), q.dtype)
}

/// Whether [`flash_attention`] runs for queries of `dtype` and width `d_head` where `kernels`
/// run: [`Kernels::Cube`] (a GPU, or lavapipe), `f32`, `d_head <= MAX_D_HEAD`.
pub fn supported(kernels: Kernels, dtype: DType, d_head: usize) -> bool {
    kernels.fuse(dtype) && (1..=MAX_D_HEAD).contains(&d_head)
}

/// [`supported`] for a call's own tensors: the guard of the public entry points, which may be
/// handed anything (a layer decides once, where it is built).
fn supported_here<const D: usize>(x: &Tensor<D>, d_head: usize) -> bool {
    supported(Kernels::for_device(&x.device()), x.dtype(), d_head)
}

/// Causal attention of `q` (`[batch, heads, seq, d_head]`) over `k`, `v`
/// (`[batch, kv_heads, seq, d_head]`, keys as many as queries; `kv_heads` dividing `heads`, query
/// head `h` reading key/value head `h / (heads / kv_heads)` without copying it) in one kernel:
/// `softmax(q kᵀ/√d_head + causal mask) · v`, with dropout `dropout` on the weights (pass 0
/// outside training). Differentiable.
///
/// # Panics
/// Where [`supported`] is false.
pub fn flash_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, dropout: f64) -> Tensor<4> {
    assert!(
        supported_here(&q, q.dims()[3]),
        "flash attention needs a CubeCL device, f32 and d_head <= {MAX_D_HEAD}"
    );
    let seed = if dropout > 0.0 { next_seed() } else { 0 };
    let (out, _lse) = Dispatch::flash_attention_forward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        dropout as f32,
        seed,
    );
    Tensor::from_dispatch(out)
}

/// [`flash_attention`] of the projection's packed output `qkv` (`[batch, seq, (heads +
/// 2·kv_heads)·d_head]`: the queries' columns, then the keys', then the values', each head's
/// `d_head` together) with `heads` query and `kv_heads` key/value heads, returning `[batch, seq,
/// heads·d_head]`: the heads concatenated, as the output projection reads them. The same
/// numbers as splitting `qkv` into heads and calling [`flash_attention`], without the copies
/// around it: the kernels read the heads in place and write the output, and the backward the
/// gradient of `qkv`, in these layouts. Differentiable.
///
/// # Panics
/// Where [`supported`] is false, or `qkv`'s width is not `(heads + 2·kv_heads)` heads.
pub fn flash_attention_packed(
    qkv: Tensor<3>,
    heads: usize,
    kv_heads: usize,
    dropout: f64,
) -> Tensor<3> {
    let width = qkv.dims()[2];
    let groups = heads + 2 * kv_heads;
    assert!(
        width.is_multiple_of(groups) && kv_heads > 0 && heads.is_multiple_of(kv_heads),
        "a packed qkv of {width} columns is not {heads} + 2·{kv_heads} heads"
    );
    assert!(
        supported_here(&qkv, width / groups),
        "flash attention needs a CubeCL device, f32 and d_head <= {MAX_D_HEAD}"
    );
    let seed = if dropout > 0.0 { next_seed() } else { 0 };
    let (out, _lse) = Dispatch::flash_attention_packed_forward(
        qkv.into_dispatch(),
        heads as u32,
        kv_heads as u32,
        dropout as f32,
        seed,
    );
    Tensor::from_dispatch(out)
}

/// The packed forward's output and the gradient of `qkv` for `d_out` (`[batch, seq,
/// heads·d_head]`), called directly: for tests.
#[doc(hidden)]
pub fn flash_attention_packed_parts(
    qkv: Tensor<3>,
    heads: usize,
    kv_heads: usize,
    d_out: Tensor<3>,
    dropout: f64,
    seed: u32,
) -> (Tensor<3>, Tensor<3>) {
    let (out, lse) = Dispatch::flash_attention_packed_forward(
        qkv.clone().into_dispatch(),
        heads as u32,
        kv_heads as u32,
        dropout as f32,
        seed,
    );
    let out = Tensor::<3>::from_dispatch(out);
    let d_qkv = Dispatch::flash_attention_packed_backward(
        qkv.into_dispatch(),
        out.clone().into_dispatch(),
        lse,
        d_out.into_dispatch(),
        heads as u32,
        kv_heads as u32,
        dropout as f32,
        seed,
    );
    (out, Tensor::from_dispatch(d_qkv))
}

/// The forward's `(out, lse)` and the gradients `(dQ, dK, dV)` for `d_out`, called directly:
/// for tests and for reading the log-sum-exp. Same inputs as [`flash_attention`] plus the seed.
#[doc(hidden)]
pub fn flash_attention_parts(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    d_out: Tensor<4>,
    dropout: f64,
    seed: u32,
) -> ([Tensor<4>; 4], Tensor<3>) {
    let (out, lse) = Dispatch::flash_attention_forward(
        q.clone().into_dispatch(),
        k.clone().into_dispatch(),
        v.clone().into_dispatch(),
        dropout as f32,
        seed,
    );
    let (out, lse) = (
        Tensor::<4>::from_dispatch(out),
        Tensor::<3>::from_dispatch(lse),
    );
    let (d_q, d_k, d_v) = Dispatch::flash_attention_backward(
        q.into_dispatch(),
        k.into_dispatch(),
        v.into_dispatch(),
        out.clone().into_dispatch(),
        lse.clone().into_dispatch(),
        d_out.into_dispatch(),
        dropout as f32,
        seed,
    );
    let grads = [d_q, d_k, d_v].map(Tensor::<4>::from_dispatch);
    let [d_q, d_k, d_v] = grads;
    ([out, d_q, d_k, d_v], lse)
}

/// The dropout of one call: probability `p` of dropping a weight, and the seed of its mask.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dropout {
    p: f32,
    seed: u32,
}

impl Dropout {
    pub(crate) fn new(p: f32, seed: u32) -> Self {
        Self { p, seed }
    }

    pub(crate) fn active(self) -> bool {
        self.p > 0.0
    }

    /// Hashes at or above this are kept: `p · 2³²`.
    pub(crate) fn threshold(self) -> u32 {
        (f64::from(self.p) * 4_294_967_296.0).min(f64::from(u32::MAX)) as u32
    }

    /// Kept weights are scaled by `1 / (1 - p)` so the expected output does not change.
    pub(crate) fn keep_scale(self) -> f32 {
        1.0 / (1.0 - self.p)
    }
}

static STREAM_SEED: AtomicU64 = AtomicU64::new(0);
static STREAM_CALL: AtomicU64 = AtomicU64::new(0);

/// Starts the stream of dropout seeds over: after `seed_dropout(s)`, the same calls to
/// [`flash_attention`] draw the same masks. A trainer calls it with each step's seed, as it seeds
/// Burn's own random numbers.
pub fn seed_dropout(seed: u64) {
    STREAM_SEED.store(seed, Ordering::SeqCst);
    STREAM_CALL.store(0, Ordering::SeqCst);
}

/// The next call's mask seed: SplitMix64 of the stream seed and the call's index.
fn next_seed() -> u32 {
    let call = STREAM_CALL.fetch_add(1, Ordering::SeqCst);
    let mut z = STREAM_SEED
        .load(Ordering::SeqCst)
        .wrapping_add(call.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}
