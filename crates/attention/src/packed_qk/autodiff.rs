//! The packed QK kernels under autodiff: the forward keeps its input and the tables, the
//! backward hands them to the backward kernel instead of differentiating op by op.

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

use super::PackedQkBackend;

/// What the forward was asked to do, for its backward.
#[derive(Debug)]
struct PackedQkBackward {
    groups: u32,
    qk_heads: u32,
    epsilon: f32,
    normalise: bool,
    rotate: bool,
}

impl<B: PackedQkBackend> Backward<B, 1> for PackedQkBackward {
    /// `qkv`, `cos`, `signed_sin` of the forward, on the inner backend.
    type State = [FloatTensor<B>; 3];

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [qkv, cos, signed_sin] = ops.state;
        let d_out = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            let d_qkv = B::packed_qk_backward(
                qkv,
                d_out,
                cos,
                signed_sin,
                self.groups,
                self.qk_heads,
                self.epsilon,
                self.normalise,
                self.rotate,
            );
            grads.register::<B>(parent.id, d_qkv);
        }
    }
}

impl<B: PackedQkBackend, C: CheckpointStrategy> PackedQkBackend for Autodiff<B, C> {
    fn packed_qk_forward(
        qkv: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        signed_sin: FloatTensor<Self>,
        groups: u32,
        qk_heads: u32,
        epsilon: f32,
        normalise: bool,
        rotate: bool,
    ) -> FloatTensor<Self> {
        let step = PackedQkBackward {
            groups,
            qk_heads,
            epsilon,
            normalise,
            rotate,
        };
        let (qkv, node) = qkv.into_parts();
        // The tables are constants: only `qkv` has a gradient.
        let (cos, signed_sin) = (cos.into_primitive(), signed_sin.into_primitive());
        // Under a checkpointing strategy the projection's output is kept rather than the
        // projection recomputed: it is what the backward reads.
        match step.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::packed_qk_forward(
                    qkv.clone(),
                    cos.clone(),
                    signed_sin.clone(),
                    groups,
                    qk_heads,
                    epsilon,
                    normalise,
                    rotate,
                );
                prep.finish([qkv, cos, signed_sin], out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::packed_qk_forward(
                qkv, cos, signed_sin, groups, qk_heads, epsilon, normalise, rotate,
            )),
        }
    }

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
    ) -> FloatTensor<Self> {
        // Called directly (not through `backward`), the gradient is a plain value.
        Self::from_inner(B::packed_qk_backward(
            qkv.into_primitive(),
            d_out.into_primitive(),
            cos.into_primitive(),
            signed_sin.into_primitive(),
            groups,
            qk_heads,
            epsilon,
            normalise,
            rotate,
        ))
    }
}
