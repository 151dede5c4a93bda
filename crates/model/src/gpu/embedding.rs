//! The token embedding's gradient as a product, not a scatter: deterministic, and without every
//! row of a frequent token adding into the same addresses.
//!
//! The forward gathers rows, `rows[i] = weights[ids[i]]`. Its gradient adds each row's gradient
//! into its token's row, `d_weights[v] = Σ_{i: ids[i] = v} d_rows[i]`. Burn computes that as a
//! scatter with atomic adds: with a character vocabulary a batch of 16,384 positions falls on
//! 65 rows, so thousands of additions queue on the same addresses (on an H100 the two
//! embedding gradients took 2.5 ms of a 55 ms f32 step and 4.2 ms of a 30 ms bf16 one), and the
//! order of the additions, so the last bits of the sums, changes from run to run. Written as
//! a matrix product of the ids' one-hot rows,
//!
//! ```text
//! d_weights [vocab, C] = one_hot(ids)ᵀ [vocab, n] · d_rows [n, C]
//! ```
//!
//! it is one matmul kernel that sums in a fixed order, at `2·vocab·n·C` multiply-adds: for a
//! small vocabulary (characters, bytes) a few hundred million, nothing on a GPU. A large
//! vocabulary keeps Burn's scatter ([`ONE_HOT_VOCAB`]).

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{AutodiffBackend, Backend, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{Int, Shape, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::cube::empty_like;

/// The largest vocabulary whose embedding gradient is the one-hot product; a larger one keeps
/// Burn's scatter (the product's work grows with the vocabulary, the scatter's does not).
pub const ONE_HOT_VOCAB: usize = 1024;

/// Units per cube of the one-hot kernel.
const THREADS: u32 = 256;

/// An embedding lookup whose gradient is the one-hot product; see the module docs.
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait EmbeddingBackend: Backend {
    /// Rows `ids` (`[n]`) of `weights` (`[vocab, C]`): `[n, C]`. Burn's gather, which its
    /// kernel fusion may merge with what follows.
    #[fusion(default)]
    fn embedding_rows(weights: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        Self::float_select(weights, 0, ids)
    }

    /// The gradient of `weights` (`[vocab, C]`) for the rows' gradient `d_rows` (`[n, C]`).
    #[fusion(meta = |d_rows, _ids, vocab| grad_spec(d_rows, *vocab))]
    fn embedding_rows_backward(
        d_rows: FloatTensor<Self>,
        ids: IntTensor<Self>,
        vocab: u32,
    ) -> FloatTensor<Self>;
}

/// `[n, C]` -> `[vocab, C]`.
fn grad_spec(d_rows: &TensorSpec, vocab: u32) -> TensorSpec {
    TensorSpec::new(Shape::new([vocab as usize, d_rows.shape[1]]), d_rows.dtype)
}

/// The rows `ids` (`[batch, seq]`) of `weights` (`[vocab, C]`): `[batch, seq, C]`, what
/// `burn::nn::Embedding` gives, differentiable with the one-hot product as the weights'
/// gradient. For f32 weights on a CubeCL device ([`super::Kernels::Cube`]) with at most
/// [`ONE_HOT_VOCAB`] rows.
pub fn embedding(weights: Tensor<2>, ids: Tensor<2, Int>) -> Tensor<3> {
    let [batch, seq] = ids.dims();
    let width = weights.dims()[1];
    let rows = Dispatch::embedding_rows(
        weights.into_dispatch(),
        ids.reshape([batch * seq]).into_dispatch(),
    );
    Tensor::<2>::from_dispatch(rows).reshape([batch, seq, width])
}

mod kernels {
    use cubecl::prelude::*;

    /// `one_hot [vocab, n]`: 1 where `ids[i]` is the row's id, else 0; one unit per value.
    #[cube(launch)]
    pub(super) fn one_hot_t_kernel<I: Int, F: Float>(
        ids: &Tensor<I>,
        one_hot: &mut Tensor<F>,
        #[define(I, F)] _dtypes: [ElemType; 2],
    ) {
        let n = ids.shape(0);
        let at = ABSOLUTE_POS;
        if at >= one_hot.len() {
            terminate!();
        }
        let (v, i) = (at / n, at % n);
        let mut x = F::new(0.0);
        if ids[i] == I::cast_from(v) {
            x = F::new(1.0);
        }
        one_hot[at] = x;
    }
}

impl EmbeddingBackend for CubeBackend {
    fn embedding_rows_backward(
        d_rows: FloatTensor<Self>,
        ids: IntTensor<Self>,
        vocab: u32,
    ) -> FloatTensor<Self> {
        let (d_rows, ids) = (into_contiguous(d_rows), into_contiguous(ids));
        let n = ids.shape()[0];
        let one_hot = empty_like(&d_rows, Shape::new([vocab as usize, n]));
        let client = d_rows.client.clone();
        let dim = CubeDim::new_1d(THREADS);
        let dtypes = [
            dtype_to_storage_type(ids.dtype),
            dtype_to_storage_type(d_rows.dtype),
        ];
        kernels::one_hot_t_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, vocab as usize * n, dim),
            dim,
            ids.into_tensor_arg(),
            one_hot.clone().into_tensor_arg(),
            dtypes,
        );
        Self::float_matmul(one_hot, d_rows)
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: the one-hot product as the weights' gradient.

/// The vocabulary (the weights' rows).
#[derive(Debug)]
struct EmbeddingBackward {
    vocab: u32,
}

impl<B: EmbeddingBackend> Backward<B, 1> for EmbeddingBackward {
    /// The ids, on the inner backend.
    type State = IntTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let d_rows = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            let d_weights = B::embedding_rows_backward(d_rows, ops.state, self.vocab);
            grads.register::<B>(parent.id, d_weights);
        }
    }
}

impl<B: EmbeddingBackend, C: CheckpointStrategy> EmbeddingBackend for Autodiff<B, C> {
    fn embedding_rows(weights: FloatTensor<Self>, ids: IntTensor<Self>) -> FloatTensor<Self> {
        let vocab = weights.shape()[0] as u32;
        let (weights, node) = weights.into_parts();
        // The ids are the state: a gather is cheap to redo, but its gradient needs only them.
        match (EmbeddingBackward { vocab })
            .prepare::<C>([node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let rows = B::embedding_rows(weights, ids.clone());
                prep.finish(ids, rows)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::embedding_rows(weights, ids)),
        }
    }

    fn embedding_rows_backward(
        d_rows: FloatTensor<Self>,
        ids: IntTensor<Self>,
        vocab: u32,
    ) -> FloatTensor<Self> {
        // Called directly (not through `backward`), the gradient is a plain value.
        Self::from_inner(B::embedding_rows_backward(
            d_rows.into_primitive(),
            ids,
            vocab,
        ))
    }
}
