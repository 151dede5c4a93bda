//! The flash-attention kernels launched on Burn's CubeCL backend (wgpu, Vulkan, CUDA, …).
//!
//! Two ways in, one set of kernels: separate `q`, `k`, `v` tensors (`[batch, heads, seq,
//! d_head]`, any strides with contiguous channels), or the projection's packed output
//! `[batch, seq, (heads + 2·kv_heads)·d_head]` seen through `[batch, heads, seq, d_head]` views
//! of its columns, with the output and the gradients written in the packed layouts directly.

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::zspace::metadata::Metadata;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::kernels::{
    flash_backward_dkdv_kernel, flash_backward_dq_kernel, flash_backward_rows_kernel,
    flash_forward_kernel,
};
use super::{Dropout, FlashAttentionBackend, MAX_BLOCK};

impl FlashAttentionBackend for CubeBackend {
    fn flash_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let heads = Heads::separate(q, k, v);
        let out = heads.empty(heads.q.shape());
        let lse = heads.forward(&out, Dropout::new(dropout, seed));
        (out, lse)
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
        let heads = Heads::separate(q, k, v);
        let (d_q, d_k, d_v) = (
            heads.empty(heads.q.shape()),
            heads.empty(heads.k.shape()),
            heads.empty(heads.k.shape()),
        );
        let grads = Grads {
            out: channels_contiguous(out),
            d_out: channels_contiguous(d_out),
            d_q: d_q.clone(),
            d_k: d_k.clone(),
            d_v: d_v.clone(),
        };
        heads.backward(grads, into_contiguous(lse), Dropout::new(dropout, seed));
        (d_q, d_k, d_v)
    }

    fn flash_attention_packed_forward(
        qkv: FloatTensor<Self>,
        heads: u32,
        kv_heads: u32,
        dropout: f32,
        seed: u32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let heads = Heads::packed(qkv, heads as usize, kv_heads as usize);
        let out = heads.empty(heads.out_shape());
        let lse = heads.forward(&heads.out_view(&out), Dropout::new(dropout, seed));
        (out, lse)
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
        let shape = qkv.shape();
        let heads = Heads::packed(qkv, heads as usize, kv_heads as usize);
        let d_qkv = heads.empty(shape);
        // The gradient has the input's layout: dQ, dK and dV go to the same columns of it.
        let d_view = heads.qkv_view(&d_qkv);
        let grads = Grads {
            out: heads.out_view(&into_contiguous(out)),
            d_out: heads.out_view(&into_contiguous(d_out)),
            d_q: d_view.clone(),
            d_k: d_view.clone(),
            d_v: d_view,
        };
        heads.backward(grads, into_contiguous(lse), Dropout::new(dropout, seed));
        d_qkv
    }
}

/// One call's queries, keys and values as the kernels read them: `[batch, heads, seq, d_head]`
/// views with contiguous channels, `k` and `v` holding their `kv_heads` heads from head
/// `k_first` and `v_first` of their views (0 for separate tensors).
struct Heads {
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    heads: usize,
    kv_heads: usize,
    k_first: usize,
    v_first: usize,
}

/// The backward's other tensors, each a `[batch, heads, seq, d_head]` view like [`Heads`]'s
/// (`d_k`, `d_v` with `k`, `v`'s head offsets).
struct Grads {
    out: CubeTensor,
    d_out: CubeTensor,
    d_q: CubeTensor,
    d_k: CubeTensor,
    d_v: CubeTensor,
}

impl Heads {
    fn separate(q: CubeTensor, k: CubeTensor, v: CubeTensor) -> Self {
        let (q, k, v) = (
            channels_contiguous(q),
            channels_contiguous(k),
            channels_contiguous(v),
        );
        let (heads, kv_heads) = (q.shape()[1], k.shape()[1]);
        Self {
            q,
            k,
            v,
            heads,
            kv_heads,
            k_first: 0,
            v_first: 0,
        }
    }

    /// The columns of `qkv` (`[batch, seq, (heads + 2·kv_heads)·d_head]`: queries, keys,
    /// values) as views, without copying.
    fn packed(qkv: CubeTensor, heads: usize, kv_heads: usize) -> Self {
        let qkv = into_contiguous(qkv);
        let view = packed_view(&qkv, heads + 2 * kv_heads);
        Self {
            q: view.clone(),
            k: view.clone(),
            v: view,
            heads,
            kv_heads,
            k_first: heads,
            v_first: heads + kv_heads,
        }
    }

    /// `[batch, seq, d_head]` of the queries.
    fn dims(&self) -> [usize; 3] {
        let [batch, _, seq, d_head] = self.q.shape().dims::<4>();
        [batch, seq, d_head]
    }

    /// A tensor shaped like the packed input's, or like the packed output's.
    fn qkv_view(&self, t: &CubeTensor) -> CubeTensor {
        packed_view(t, self.heads + 2 * self.kv_heads)
    }

    fn out_shape(&self) -> Shape {
        let [batch, seq, d_head] = self.dims();
        Shape::new([batch, seq, self.heads * d_head])
    }

    /// `[batch, seq, heads·d_head]` (the packed output, or its gradient) as heads.
    fn out_view(&self, t: &CubeTensor) -> CubeTensor {
        packed_view(t, self.heads)
    }

    fn empty(&self, shape: Shape) -> CubeTensor {
        let t = &self.q;
        empty_device_dtype(t.client.clone(), t.device.clone(), shape, t.dtype)
    }

    /// Runs the forward into `out` (a view like `q`); returns the log-sum-exp.
    fn forward(&self, out: &CubeTensor, dropout: Dropout) -> CubeTensor {
        let launch = Launch::new(self, dropout);
        let client = self.q.client.clone();
        let [batch, seq, _] = self.dims();
        let lse = self.empty(Shape::new([batch, self.heads, seq]));
        flash_forward_kernel::launch(
            &client,
            launch.blocks(),
            launch.cube_dim(),
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            self.heads,
            self.kv_heads,
            self.k_first,
            self.v_first,
            launch.scale,
            launch.dropout.keep_scale(),
            launch.dropout.threshold(),
            launch.dropout.seed,
            launch.d_head,
            launch.block,
            launch.dropout.active(),
            launch.dtype,
        );
        lse
    }

    /// Runs the backward, writing `g`'s `d_q`, `d_k` and `d_v`.
    fn backward(&self, g: Grads, lse: CubeTensor, dropout: Dropout) {
        let launch = Launch::new(self, dropout);
        let client = self.q.client.clone();
        let [batch, seq, _] = self.dims();
        let rows = batch * self.heads * seq;
        let stats = self.empty(Shape::new([rows, 2]));
        let row_dim = CubeDim::new(&client, rows);
        flash_backward_rows_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, rows, row_dim),
            row_dim,
            g.out.into_tensor_arg(),
            g.d_out.clone().into_tensor_arg(),
            lse.into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            launch.d_head,
            launch.dtype,
        );
        flash_backward_dkdv_kernel::launch(
            &client,
            launch.key_blocks(),
            launch.cube_dim(),
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            g.d_out.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            g.d_k.into_tensor_arg(),
            g.d_v.into_tensor_arg(),
            self.heads,
            self.kv_heads,
            self.k_first,
            self.v_first,
            launch.scale,
            launch.dropout.keep_scale(),
            launch.dropout.threshold(),
            launch.dropout.seed,
            launch.d_head,
            launch.block,
            launch.dropout.active(),
            launch.dtype,
        );
        flash_backward_dq_kernel::launch(
            &client,
            launch.blocks(),
            launch.cube_dim(),
            self.q.clone().into_tensor_arg(),
            self.k.clone().into_tensor_arg(),
            self.v.clone().into_tensor_arg(),
            g.d_out.into_tensor_arg(),
            stats.into_tensor_arg(),
            g.d_q.into_tensor_arg(),
            self.heads,
            self.kv_heads,
            self.k_first,
            self.v_first,
            launch.scale,
            launch.dropout.keep_scale(),
            launch.dropout.threshold(),
            launch.dropout.seed,
            launch.d_head,
            launch.block,
            launch.dropout.active(),
            launch.dtype,
        );
    }
}

/// `t` (`[batch, seq, groups·d_head]`, contiguous) seen as `[batch, groups, seq, d_head]`:
/// head `h` of row `r` at `r·width + h·d_head`. The same buffer, no copy.
fn packed_view(t: &CubeTensor, groups: usize) -> CubeTensor {
    let [batch, seq, width] = t.shape().dims::<3>();
    let d_head = width / groups;
    let mut view = t.clone();
    *view.meta = Metadata::new(
        [batch, groups, seq, d_head],
        [seq * width, d_head, width, 1],
    );
    view
}

/// `t` as it is when its channels (last axis) are contiguous, which is all the kernels need;
/// else a contiguous copy.
fn channels_contiguous(t: CubeTensor) -> CubeTensor {
    match t.meta.strides().last() {
        Some(1) => t,
        _ => into_contiguous(t),
    }
}

/// The shape of one flash-attention launch: one cube per block of `block` rows of each
/// `(batch, head)`.
struct Launch {
    batch: usize,
    heads: usize,
    kv_heads: usize,
    seq: usize,
    d_head: usize,
    block: usize,
    scale: f32,
    dropout: Dropout,
    dtype: cubecl::ir::ElemType,
}

impl Launch {
    fn new(heads: &Heads, dropout: Dropout) -> Self {
        let q = &heads.q;
        let [batch, seq, d_head] = heads.dims();
        // Two tiles of `block` rows (and two rows of statistics) must fit in shared memory.
        let shared = q.client.properties().hardware.max_shared_memory_size;
        let row_bytes = 2 * (d_head + 1) * q.dtype.size();
        let mut block = MAX_BLOCK;
        while block > 1 && block * row_bytes > shared {
            block /= 2;
        }
        Self {
            batch,
            heads: heads.heads,
            kv_heads: heads.kv_heads,
            seq,
            d_head,
            block,
            scale: 1.0 / (d_head as f32).sqrt(),
            dropout,
            dtype: dtype_to_storage_type(q.dtype),
        }
    }

    fn blocks(&self) -> CubeCount {
        CubeCount::Static(
            self.seq.div_ceil(self.block) as u32,
            (self.batch * self.heads) as u32,
            1,
        )
    }

    /// One cube per block of keys of each `(batch, key/value head)`.
    fn key_blocks(&self) -> CubeCount {
        CubeCount::Static(
            self.seq.div_ceil(self.block) as u32,
            (self.batch * self.kv_heads) as u32,
            1,
        )
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim::new_1d(self.block as u32)
    }
}
