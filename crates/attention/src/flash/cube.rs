//! The flash-attention kernels launched on Burn's CubeCL backend (wgpu, Vulkan, CUDA, …).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
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
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let launch = Launch::new(&q, Dropout::new(dropout, seed));
        let client = q.client.clone();
        let out = launch.empty(q.shape());
        let lse = launch.empty(Shape::new([launch.batch, launch.heads, launch.seq]));
        flash_forward_kernel::launch(
            &client,
            launch.blocks(),
            launch.cube_dim(),
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            lse.clone().into_tensor_arg(),
            launch.scale,
            launch.dropout.keep_scale(),
            launch.dropout.threshold(),
            launch.dropout.seed,
            launch.d_head,
            launch.block,
            launch.dropout.active(),
            launch.dtype,
        );
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
        let (q, k, v) = (into_contiguous(q), into_contiguous(k), into_contiguous(v));
        let (out, lse, d_out) = (
            into_contiguous(out),
            into_contiguous(lse),
            into_contiguous(d_out),
        );
        let launch = Launch::new(&q, Dropout::new(dropout, seed));
        let client = q.client.clone();
        let rows = launch.batch * launch.heads * launch.seq;
        let stats = launch.empty(Shape::new([rows, 2]));
        let row_dim = CubeDim::new(&client, rows);
        flash_backward_rows_kernel::launch(
            &client,
            calculate_cube_count_elemwise(&client, rows, row_dim),
            row_dim,
            out.into_tensor_arg(),
            d_out.clone().into_tensor_arg(),
            lse.into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            launch.d_head,
            launch.dtype,
        );
        let kv_heads = k.shape().dims::<4>()[1];
        let (d_q, d_k, d_v) = (
            launch.empty(q.shape()),
            launch.empty(k.shape()),
            launch.empty(k.shape()),
        );
        flash_backward_dkdv_kernel::launch(
            &client,
            launch.key_blocks(kv_heads),
            launch.cube_dim(),
            q.clone().into_tensor_arg(),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            d_out.clone().into_tensor_arg(),
            stats.clone().into_tensor_arg(),
            d_k.clone().into_tensor_arg(),
            d_v.clone().into_tensor_arg(),
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
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            d_out.into_tensor_arg(),
            stats.into_tensor_arg(),
            d_q.clone().into_tensor_arg(),
            launch.scale,
            launch.dropout.keep_scale(),
            launch.dropout.threshold(),
            launch.dropout.seed,
            launch.d_head,
            launch.block,
            launch.dropout.active(),
            launch.dtype,
        );
        (d_q, d_k, d_v)
    }
}

/// The shape of one flash-attention launch: one cube per block of `block` rows of each
/// `(batch, head)`.
struct Launch {
    batch: usize,
    heads: usize,
    seq: usize,
    d_head: usize,
    block: usize,
    scale: f32,
    dropout: Dropout,
    dtype: cubecl::ir::ElemType,
    template: CubeTensor,
}

impl Launch {
    /// From the queries `[batch, heads, seq, d_head]`.
    fn new(q: &CubeTensor, dropout: Dropout) -> Self {
        let [batch, heads, seq, d_head] = q.shape().dims::<4>();
        // Two tiles of `block` rows (and two rows of statistics) must fit in shared memory.
        let shared = q.client.properties().hardware.max_shared_memory_size;
        let row_bytes = 2 * (d_head + 1) * q.dtype.size();
        let mut block = MAX_BLOCK;
        while block > 1 && block * row_bytes > shared {
            block /= 2;
        }
        Self {
            batch,
            heads,
            seq,
            d_head,
            block,
            scale: 1.0 / (d_head as f32).sqrt(),
            dropout,
            dtype: dtype_to_storage_type(q.dtype),
            template: q.clone(),
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
    fn key_blocks(&self, kv_heads: usize) -> CubeCount {
        CubeCount::Static(
            self.seq.div_ceil(self.block) as u32,
            (self.batch * kv_heads) as u32,
            1,
        )
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim::new_1d(self.block as u32)
    }

    fn empty(&self, shape: Shape) -> CubeTensor {
        let t = &self.template;
        empty_device_dtype(t.client.clone(), t.device.clone(), shape, t.dtype)
    }
}
