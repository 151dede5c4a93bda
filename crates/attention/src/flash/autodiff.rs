//! Flash attention under autodiff: the forward keeps its inputs, output and log-sum-exp; the
//! backward hands them to the backward kernels instead of differentiating op by op.

use burn::backend::AutodiffBackend;
use burn::backend::autodiff::Autodiff;
use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

use super::FlashAttentionBackend;

/// The backward step: gradients of `q`, `k`, `v` from the saved forward.
#[derive(Debug)]
struct FlashAttentionBackward {
    dropout: f32,
    seed: u32,
}

/// `q`, `k`, `v`, `out`, `lse` of the forward, on the inner backend.
type Saved<B> = [FloatTensor<B>; 5];

impl<B: FlashAttentionBackend> Backward<B, 3> for FlashAttentionBackward {
    type State = Saved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [q, k, v, out, lse] = ops.state;
        let d_out = grads.consume::<B>(&ops.node);
        let (d_q, d_k, d_v) =
            B::flash_attention_backward(q, k, v, out, lse, d_out, self.dropout, self.seed);
        for (parent, grad) in ops.parents.into_iter().zip([d_q, d_k, d_v]) {
            if let Some(parent) = parent {
                grads.register::<B>(parent.id, grad);
            }
        }
    }
}

/// The packed backward step: the gradient of `qkv` from the saved forward.
#[derive(Debug)]
struct PackedBackward {
    heads: u32,
    kv_heads: u32,
    dropout: f32,
    seed: u32,
}

impl<B: FlashAttentionBackend> Backward<B, 1> for PackedBackward {
    /// `qkv`, `out`, `lse` of the forward, on the inner backend.
    type State = [FloatTensor<B>; 3];

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [qkv, out, lse] = ops.state;
        let d_out = grads.consume::<B>(&ops.node);
        let [parent] = ops.parents;
        if let Some(parent) = parent {
            let d_qkv = B::flash_attention_packed_backward(
                qkv,
                out,
                lse,
                d_out,
                self.heads,
                self.kv_heads,
                self.dropout,
                self.seed,
            );
            grads.register::<B>(parent.id, d_qkv);
        }
    }
}

impl<B: FlashAttentionBackend, C: CheckpointStrategy> FlashAttentionBackend for Autodiff<B, C> {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let step = FlashAttentionBackward { dropout, seed };
        let (q, q_node) = q.into_parts();
        let (k, k_node) = k.into_parts();
        let (v, v_node) = v.into_parts();
        // The scores are recomputed in the backward, never saved: that is the point of the
        // kernel, so the op is compute-bound state (saved), not memory-bound (recomputed).
        match step
            .prepare::<C>([q_node, k_node, v_node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (out, lse) =
                    B::flash_attention_forward(q.clone(), k.clone(), v.clone(), dropout, seed);
                let state = [q, k, v, out.clone(), lse.clone()];
                (prep.finish(state, out), Self::from_inner(lse))
            }
            OpsKind::UnTracked(prep) => {
                let (out, lse) = B::flash_attention_forward(q, k, v, dropout, seed);
                (prep.finish(out), Self::from_inner(lse))
            }
        }
    }

    fn flash_attention_packed_forward(
        qkv: FloatTensor<Self>,
        heads: u32,
        kv_heads: u32,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let step = PackedBackward {
            heads,
            kv_heads,
            dropout,
            seed,
        };
        let (qkv, node) = qkv.into_parts();
        // Saved, not recomputed, as the unpacked op's state is.
        match step.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (out, lse) =
                    B::flash_attention_packed_forward(qkv.clone(), heads, kv_heads, dropout, seed);
                let state = [qkv, out.clone(), lse.clone()];
                (prep.finish(state, out), Self::from_inner(lse))
            }
            OpsKind::UnTracked(prep) => {
                let (out, lse) =
                    B::flash_attention_packed_forward(qkv, heads, kv_heads, dropout, seed);
                (prep.finish(out), Self::from_inner(lse))
            }
        }
    }

    fn flash_attention_packed_backward(
        qkv: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        heads: u32,
        kv_heads: u32,
        dropout: f32,
        seed: u32,
    ) -> FloatTensor<Self> {
        // Called directly (not through `backward`), the gradient is a plain value.
        Self::from_inner(B::flash_attention_packed_backward(
            qkv.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            d_out.into_primitive(),
            heads,
            kv_heads,
            dropout,
            seed,
        ))
    }

    fn flash_attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Called directly (not through `backward`), the gradients are plain values.
        let (d_q, d_k, d_v) = B::flash_attention_backward(
            q.into_primitive(),
            k.into_primitive(),
            v.into_primitive(),
            out.into_primitive(),
            lse.into_primitive(),
            d_out.into_primitive(),
            dropout,
            seed,
        );
        (
            Self::from_inner(d_q),
            Self::from_inner(d_k),
            Self::from_inner(d_v),
        )
    }
}
