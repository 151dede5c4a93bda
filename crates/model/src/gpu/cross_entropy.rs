//! The next-token cross-entropy with `ignore_index` in one kernel forward and one backward.
//!
//! Burn's path (`log_softmax`, `gather`, the mask, the mean) writes the `[rows, vocab]`
//! log-probabilities and reads them back, and its backward does so again through each op.
//! Here:
//!
//! - forward, one cube per row: the row's max and `Σ exp(x - max)` reduced in shared memory,
//!   `lse = max + ln Σ`, and the row's loss `lse - x[target]` (0 where the target is
//!   [`IGNORE_INDEX`](crate::IGNORE_INDEX)); `lse` is kept for the backward;
//! - backward, one unit per logit: `d x[v] = (exp(x[v] - lse) - [v = target]) · d loss_row`,
//!   0 on ignored rows. The softmax exists only in registers.
//!
//! The mean over the kept targets is Burn's `sum` divided by their count, known on the host.

use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{AutodiffBackend, Backend, Dispatch, TensorMetadata, backend_extension};
use burn::tensor::{Int, Shape, Tensor};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use cubecl::{CubeDim, calculate_cube_count_elemwise};

use super::cube::{cube_count, empty_like};

/// Units per cube of the row kernel (a power of two).
const THREADS: usize = 128;

/// The cross-entropy as a backend operation, on logits `[rows, vocab]` and targets `[rows]`
/// given as floats (exact for ids below 2²⁴; [`IGNORE_INDEX`](crate::IGNORE_INDEX) = -1).
#[backend_extension(Cube, Fusion, Autodiff)]
pub trait CrossEntropyBackend: Backend {
    /// `(loss, lse)`: each row's `-log softmax(x)[target]` (0 where ignored) and its
    /// log-sum-exp, `[rows]` each.
    #[fusion(meta = |logits, _targets| (rows_spec(logits), rows_spec(logits)))]
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// The logits' gradient `[rows, vocab]` for the rows' loss gradient `d_loss` `[rows]`.
    #[fusion(meta = |logits, _targets, _lse, _d_loss| logits.clone())]
    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_loss: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// `[rows, vocab]` -> `[rows]`.
fn rows_spec(logits: &TensorSpec) -> TensorSpec {
    TensorSpec::new(Shape::new([logits.shape[0]]), logits.dtype)
}

/// [`cross_entropy_counted`](crate::cross_entropy_counted) by the fused kernels (which calls
/// it after checking the arguments): the mean of `-log softmax(logits)[target]` over the
/// `kept` targets that are not [`IGNORE_INDEX`](crate::IGNORE_INDEX); differentiable. `logits` `[n, vocab]` on a
/// CubeCL device (a model running [`Kernels::Cube`](super::Kernels::Cube)), `targets` `[n]`.
pub fn cross_entropy(logits: Tensor<2>, targets: Tensor<1, Int>, kept: usize) -> Tensor<1> {
    let (losses, _lse) =
        Dispatch::cross_entropy_forward(logits.into_dispatch(), targets.float().into_dispatch());
    super::sum_all(Tensor::<1>::from_dispatch(losses)) / kept as f32
}

/// The forward's `(loss, lse)` per row and the logits' gradient for `d_loss`, called
/// directly (for tests).
#[doc(hidden)]
pub fn cross_entropy_parts(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    d_loss: Tensor<1>,
) -> (Tensor<1>, Tensor<1>, Tensor<2>) {
    let targets = targets.float();
    let (losses, lse) = Dispatch::cross_entropy_forward(
        logits.clone().into_dispatch(),
        targets.clone().into_dispatch(),
    );
    let lse = Tensor::<1>::from_dispatch(lse);
    let d_logits = Dispatch::cross_entropy_backward(
        logits.into_dispatch(),
        targets.into_dispatch(),
        lse.clone().into_dispatch(),
        d_loss.into_dispatch(),
    );
    (
        Tensor::from_dispatch(losses),
        lse,
        Tensor::from_dispatch(d_logits),
    )
}

// ---------------------------------------------------------------------------------------------
// Kernels, forward and backward side by side.

mod kernels {
    use cubecl::prelude::*;

    use crate::gpu::cube::{cube_max, cube_sum};

    /// Forward: one cube per row of `logits` `[rows, vocab]`.
    #[cube(launch)]
    pub(super) fn cross_entropy_forward_kernel<F: Float>(
        logits: &Tensor<F>,
        targets: &Tensor<F>,
        loss: &mut Tensor<F>,
        lse: &mut Tensor<F>,
        #[comptime] threads: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let (rows, vocab) = (logits.shape(0), logits.shape(1));
        let row = CUBE_POS;
        if row >= rows {
            terminate!();
        }
        let unit = UNIT_POS_X as usize;
        let base = row * vocab;
        let mut shared = Shared::<[F]>::new_slice(threads);

        // WGSL has no -inf literal: any finite logit is larger than this.
        let mut largest = F::new(-3.0e38);
        let mut v = unit;
        while v < vocab {
            largest = F::max(largest, logits[base + v]);
            v += threads;
        }
        let row_max = cube_max::<F>(largest, &mut shared);

        let mut sum = F::new(0.0);
        v = unit;
        while v < vocab {
            sum += F::exp(logits[base + v] - row_max);
            v += threads;
        }
        let row_lse = row_max + F::ln(cube_sum::<F>(sum, &mut shared));

        if unit == 0 {
            let target = targets[row];
            let mut row_loss = F::new(0.0);
            if target >= F::new(0.0) {
                row_loss = row_lse - logits[base + u32::cast_from(target) as usize];
            }
            loss[row] = row_loss;
            lse[row] = row_lse;
        }
    }

    /// Backward: one unit per logit, `(softmax - one-hot) · d_loss` of its row.
    #[cube(launch)]
    pub(super) fn cross_entropy_backward_kernel<F: Float>(
        logits: &Tensor<F>,
        targets: &Tensor<F>,
        lse: &Tensor<F>,
        d_loss: &Tensor<F>,
        d_logits: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        let (rows, vocab) = (logits.shape(0), logits.shape(1));
        let position = ABSOLUTE_POS;
        if position >= rows * vocab {
            terminate!();
        }
        let (row, v) = (position / vocab, position % vocab);
        let target = targets[row];
        let mut grad = F::new(0.0);
        if target >= F::new(0.0) {
            let mut p = F::exp(logits[position] - lse[row]);
            if u32::cast_from(target) as usize == v {
                p -= F::new(1.0);
            }
            grad = p * d_loss[row];
        }
        d_logits[position] = grad;
    }
}

// ---------------------------------------------------------------------------------------------
// Launches on Burn's CubeCL backend.

impl CrossEntropyBackend for CubeBackend {
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (logits, targets) = (into_contiguous(logits), into_contiguous(targets));
        let rows = logits.shape()[0];
        let client = logits.client.clone();
        let empty = || empty_like(&logits, Shape::new([rows]));
        let (loss, lse) = (empty(), empty());
        let dtype = dtype_to_storage_type(logits.dtype);
        kernels::cross_entropy_forward_kernel::launch(
            &client,
            cube_count(&client, rows),
            CubeDim::new_1d(THREADS as u32),
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            loss.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            THREADS,
            dtype,
        );
        (loss, lse)
    }

    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_loss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (logits, targets) = (into_contiguous(logits), into_contiguous(targets));
        let (lse, d_loss) = (into_contiguous(lse), into_contiguous(d_loss));
        let client = logits.client.clone();
        let d_logits = empty_like(&logits, logits.shape());
        let dim = CubeDim::new_1d(THREADS as u32);
        let dtype = dtype_to_storage_type(logits.dtype);
        kernels::cross_entropy_backward_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, logits.shape().num_elements(), dim),
            dim,
            logits.into_tensor_arg(),
            targets.into_tensor_arg(),
            lse.into_tensor_arg(),
            d_loss.into_tensor_arg(),
            d_logits.clone().into_tensor_arg(),
            dtype,
        );
        d_logits
    }
}

// ---------------------------------------------------------------------------------------------
// Autodiff: the backward kernel instead of differentiating log_softmax and gather.

#[derive(Debug)]
struct CrossEntropyBackward;

/// `logits`, `targets`, `lse` of the forward, on the inner backend.
type Saved<B> = [FloatTensor<B>; 3];

impl<B: CrossEntropyBackend> Backward<B, 1> for CrossEntropyBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [logits, targets, lse] = ops.state;
        let d_loss = grads.consume::<B>(&ops.node);
        let d_logits = B::cross_entropy_backward(logits, targets, lse, d_loss);
        if let [Some(parent)] = ops.parents {
            grads.register::<B>(parent.id, d_logits);
        }
    }
}

impl<B: CrossEntropyBackend, C: CheckpointStrategy> CrossEntropyBackend for Autodiff<B, C> {
    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (logits, logits_node) = logits.into_parts();
        let targets = targets.into_primitive();
        match CrossEntropyBackward
            .prepare::<C>([logits_node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (loss, lse) = B::cross_entropy_forward(logits.clone(), targets.clone());
                let state = [logits, targets, lse.clone()];
                (prep.finish(state, loss), Self::from_inner(lse))
            }
            OpsKind::UnTracked(prep) => {
                let (loss, lse) = B::cross_entropy_forward(logits, targets);
                (prep.finish(loss), Self::from_inner(lse))
            }
        }
    }

    fn cross_entropy_backward(
        logits: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_loss: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        // Called directly (not through `backward`), the gradient is a plain value.
        Self::from_inner(B::cross_entropy_backward(
            logits.into_primitive(),
            targets.into_primitive(),
            lse.into_primitive(),
            d_loss.into_primitive(),
        ))
    }
}
