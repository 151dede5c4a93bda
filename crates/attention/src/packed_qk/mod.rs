//! # QK-norm and the rotation in one kernel, on the packed heads
//!
//! Before flash attention reads the queries and keys, a `modern` layer normalises them
//! ([`qk_norm`](crate::qk_norm)) and rotates them by their positions ([`rope`](crate::rope)).
//! Written with tensor ops that is a square, a mean, a square root and a division, then two
//! products, a flip and a sum, each a launch on a GPU (fewer where Burn's fusion joins them), and
//! autodiff differentiates them one by one; the projection's output must also be split into
//! query, key and value heads first and the gradients put back together after. Here it is one
//! kernel forward and one backward on the projection's packed output `[batch, seq, (heads +
//! 2·kv_heads)·d_head]`, where flash attention then reads the heads in place
//! ([`flash_attention_packed`](crate::flash::flash_attention_packed)): the value heads pass
//! through unchanged, and the gradient comes back in the same layout.
//!
//! The kernels compute what [`rms_norm_heads`](crate::qk_norm::rms_norm_heads) and
//! [`RopeRows::apply`] compute on the split heads (the tests hold them to it, output and
//! gradient), from the same cosine and sine tables; [`kernels`] has the formulas.

mod autodiff;
mod cube;
pub mod kernels;

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, backend_extension};
use burn::tensor::{Tensor, TensorData};

use crate::flash;
use crate::kernels::Kernels;
use crate::rope::RopeRows;

/// The two kernels as a backend operation. `qkv`: the packed heads `[batch, seq, (heads +
/// 2·kv_heads)·d_head]`, the first `qk_heads` of each row's `d_head`-wide groups queries and
/// keys; `cos`, `signed_sin`: the rotation's tables `[seq, d_head]` (read only with `rotate`).
///
/// Implemented for Burn's CubeCL backend, lazily under its kernel fusion, and for autodiff with
/// the backward wired by hand. Use [`normalise_and_rotate`].
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait PackedQkBackend: Backend {
    /// The packed heads with the queries and keys normalised (`normalise`, with `epsilon`),
    /// then rotated (`rotate`); the values as they are. Shape kept.
    #[fusion(dtype = qkv, shape = qkv)]
    #[allow(clippy::too_many_arguments)]
    fn packed_qk_forward(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
        groups: u32,
        qk_heads: u32,
        epsilon: f32,
        normalise: bool,
        rotate: bool,
    ) -> FloatTensor<Self>;

    /// The gradient of the forward's input `qkv` for the output's gradient `d_out` (both
    /// shaped like `qkv`).
    #[fusion(dtype = qkv, shape = qkv)]
    #[allow(clippy::too_many_arguments)]
    fn packed_qk_backward(
        qkv: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
        groups: u32,
        qk_heads: u32,
        epsilon: f32,
        normalise: bool,
        rotate: bool,
    ) -> FloatTensor<Self>;
}

/// What one call does to the queries and keys.
#[derive(Debug, Clone, Copy)]
pub struct QkPrep<'a> {
    /// QK-norm's ε, when they are normalised.
    pub qk_norm_eps: Option<f64>,
    /// The rotation of positions `0..seq`, when they are rotated (applied after the norm).
    pub rope: Option<&'a RopeRows>,
}

/// The packed heads `qkv` `[batch, seq, (heads + 2·kv_heads)·d_head]` (queries, keys, values
/// side by side) with the queries and keys normalised and rotated as `prep` says and the values
/// unchanged: same shape, one kernel. Differentiable.
///
/// # Panics
/// Where [`flash::supported`] is false for `qkv` (the layer only calls it on its flash path),
/// or `qkv`'s width is not `heads + 2·kv_heads` heads.
pub fn normalise_and_rotate(
    qkv: Tensor<3>,
    heads: usize,
    kv_heads: usize,
    prep: QkPrep<'_>,
) -> Tensor<3> {
    let (forward, _) = call(qkv, heads, kv_heads, prep, None);
    forward
}

/// [`normalise_and_rotate`]'s output and the gradient of `qkv` for `d_out`, from the kernels
/// called directly: for tests.
#[doc(hidden)]
pub fn normalise_and_rotate_parts(
    qkv: Tensor<3>,
    heads: usize,
    kv_heads: usize,
    prep: QkPrep<'_>,
    d_out: Tensor<3>,
) -> (Tensor<3>, Tensor<3>) {
    let (forward, backward) = call(qkv, heads, kv_heads, prep, Some(d_out));
    (forward, backward.expect("a gradient was asked for"))
}

/// The forward, and the backward for `d_out` when there is one.
fn call(
    qkv: Tensor<3>,
    heads: usize,
    kv_heads: usize,
    prep: QkPrep<'_>,
    d_out: Option<Tensor<3>>,
) -> (Tensor<3>, Option<Tensor<3>>) {
    let [_, seq, width] = qkv.dims();
    let groups = heads + 2 * kv_heads;
    assert!(
        width.is_multiple_of(groups) && kv_heads > 0,
        "a packed qkv of {width} columns is not {heads} + 2·{kv_heads} heads"
    );
    let d_head = width / groups;
    assert!(
        flash::supported(Kernels::for_device(&qkv.device()), qkv.dtype(), d_head),
        "the packed QK kernels need a CubeCL device, f32 and d_head <= {}",
        flash::MAX_D_HEAD
    );
    // f32 (asserted above), as the tables are: no cast.
    let tables = |t: &Tensor<4>| t.clone().reshape([seq, d_head]);
    let (cos, signed_sin) = match prep.rope {
        Some(rope) => (tables(&rope.cos), tables(&rope.signed_sin)),
        // Never read without a rotation: a number uploaded (no launch) stands in for each.
        None => {
            let unread =
                || Tensor::<2>::from_data(TensorData::new(vec![0.0_f32], [1, 1]), &qkv.device());
            (unread(), unread())
        }
    };
    let (groups, qk_heads) = (groups as u32, (heads + kv_heads) as u32);
    let epsilon = prep.qk_norm_eps.unwrap_or(0.0) as f32;
    let (normalise, rotate) = (prep.qk_norm_eps.is_some(), prep.rope.is_some());
    let out = Dispatch::packed_qk_forward(
        qkv.clone().into_dispatch(),
        cos.clone().into_dispatch(),
        signed_sin.clone().into_dispatch(),
        groups,
        qk_heads,
        epsilon,
        normalise,
        rotate,
    );
    let grad = d_out.map(|d_out| {
        Tensor::from_dispatch(Dispatch::packed_qk_backward(
            qkv.into_dispatch(),
            d_out.into_dispatch(),
            cos.into_dispatch(),
            signed_sin.into_dispatch(),
            groups,
            qk_heads,
            epsilon,
            normalise,
            rotate,
        ))
    });
    (Tensor::from_dispatch(out), grad)
}
