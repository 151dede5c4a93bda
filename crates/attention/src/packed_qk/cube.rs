//! The two kernels launched on Burn's CubeCL backend (wgpu, Vulkan, CUDA, …).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::FloatTensor;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::{CubeCount, CubeDim, calculate_cube_count_elemwise};

use super::PackedQkBackend;
use super::kernels::{qk_backward_kernel, qk_forward_kernel};

/// Units per cube the launches aim at: whole vectors of `lanes` units each, as many as fit.
const UNITS: usize = 128;

impl PackedQkBackend for CubeBackend {
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
        let qkv = into_contiguous(qkv);
        let out = empty_like(&qkv);
        let launch = Launch::new(&qkv, groups as usize);
        qk_forward_kernel::launch(
            &qkv.client.clone(),
            launch.cubes(&qkv),
            launch.cube_dim(),
            qkv.clone().into_tensor_arg(),
            into_contiguous(cos).into_tensor_arg(),
            into_contiguous(signed_sin).into_tensor_arg(),
            out.clone().into_tensor_arg(),
            launch.vectors,
            launch.seq,
            groups as usize,
            qk_heads as usize,
            epsilon,
            launch.d_head,
            launch.lanes,
            launch.vectors_per_cube,
            normalise,
            rotate,
            dtype_to_storage_type(qkv.dtype),
        );
        out
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
        let qkv = into_contiguous(qkv);
        let d_qkv = empty_like(&qkv);
        let launch = Launch::new(&qkv, groups as usize);
        qk_backward_kernel::launch(
            &qkv.client.clone(),
            launch.cubes(&qkv),
            launch.cube_dim(),
            qkv.clone().into_tensor_arg(),
            into_contiguous(d_out).into_tensor_arg(),
            into_contiguous(cos).into_tensor_arg(),
            into_contiguous(signed_sin).into_tensor_arg(),
            d_qkv.clone().into_tensor_arg(),
            launch.vectors,
            launch.seq,
            groups as usize,
            qk_heads as usize,
            epsilon,
            launch.d_head,
            launch.lanes,
            launch.vectors_per_cube,
            normalise,
            rotate,
            dtype_to_storage_type(qkv.dtype),
        );
        d_qkv
    }
}

/// An uninitialised tensor shaped like `like`, on its device, in its dtype.
fn empty_like(like: &CubeTensor) -> CubeTensor {
    empty_device_dtype(
        like.client.clone(),
        like.device.clone(),
        like.shape(),
        like.dtype,
    )
}

/// The shape of one launch over the packed heads `[batch, seq, groups·d_head]`.
struct Launch {
    /// Head vectors in all: `batch·seq·groups`.
    vectors: usize,
    seq: usize,
    d_head: usize,
    /// Units per vector: `⌈d_head/2⌉` rounded up to a power of two.
    lanes: usize,
    vectors_per_cube: usize,
}

impl Launch {
    fn new(qkv: &CubeTensor, groups: usize) -> Self {
        let [batch, seq, width] = qkv.shape().dims::<3>();
        let lanes = (width / groups).div_ceil(2).next_power_of_two();
        Self {
            vectors: batch * seq * groups,
            seq,
            d_head: width / groups,
            lanes,
            vectors_per_cube: (UNITS / lanes).max(1),
        }
    }

    /// One cube per `vectors_per_cube` vectors, spread over the grid's axes when one axis
    /// cannot hold them (the kernels read their cube's index as `CUBE_POS`).
    fn cubes(&self, qkv: &CubeTensor) -> CubeCount {
        let cubes = self.vectors.div_ceil(self.vectors_per_cube);
        calculate_cube_count_elemwise(&qkv.client, cubes, CubeDim::new_1d(1))
    }

    fn cube_dim(&self) -> CubeDim {
        CubeDim::new_2d(self.lanes as u32, self.vectors_per_cube as u32)
    }
}
