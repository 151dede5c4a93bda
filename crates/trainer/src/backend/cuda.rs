//! Burn's CUDA backend (`--backend cuda`, compiled in with `--features cuda`): finding a device
//! with a clear error instead of a panic, and asking it how much memory is free.
//!
//! Burn opens a CUDA device lazily, on a worker thread: on a machine without a driver the first
//! tensor operation panics there. So the device is probed first: the driver library, a GPU,
//! and `libdevice.10.bc` (CUDA's math library, which kernels using `exp` or `erf` link; it comes
//! with the CUDA toolkit, not the driver).

use burn::tensor::Device;

/// Why `--backend cuda` has no device here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error(
        "--backend cuda: this tinygpt was built without CUDA; rebuild with --features cuda \
         (scripts/llvm-for-cuda.sh installs the LLVM it needs when only package registries are \
         reachable)"
    )]
    NotCompiled,
    #[error(
        "--backend cuda: no NVIDIA driver on this machine (libcuda.so could not be loaded); use \
         --backend wgpu or flex"
    )]
    NoDriver,
    #[error(
        "--backend cuda: the NVIDIA driver sees no GPU (see nvidia-smi, and CUDA_VISIBLE_DEVICES \
         if it is set); use --backend wgpu or flex"
    )]
    NoGpu,
    #[error(
        "--backend cuda: libdevice.10.bc, CUDA's math library for GPU kernels, was not found under \
         CUDA_PATH, /usr/local/cuda, /opt/cuda, /usr/lib/cuda or /usr: install the CUDA toolkit, \
         or set CUDA_PATH to a directory holding nvvm/libdevice"
    )]
    NoLibdevice,
}

/// The CUDA device tinygpt runs on, with its ordinal: of the GPUs `CUDA_VISIBLE_DEVICES` shows,
/// GPU `local_rank mod count` (GPU 0 for one process; one GPU a rank when a host runs as many
/// ranks as it has GPUs), or why there is none.
#[cfg(feature = "cuda")]
pub fn device(local_rank: usize) -> Result<(Device, usize), Unavailable> {
    use burn::tensor::DeviceType;
    // SAFETY: only tries to dlopen each of the driver library's names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Unavailable::NoDriver);
    }
    let gpus = Device::enumerate(DeviceType::Cuda).into_vec();
    if gpus.is_empty() {
        return Err(Unavailable::NoGpu);
    }
    let ordinal = local_rank % gpus.len();
    libdevice().ok_or(Unavailable::NoLibdevice)?;
    Ok((gpus[ordinal].clone(), ordinal))
}

#[cfg(not(feature = "cuda"))]
pub fn device(_local_rank: usize) -> Result<(Device, usize), Unavailable> {
    Err(Unavailable::NotCompiled)
}
/// Bytes free on CUDA GPU `ordinal` now, from the driver (`cuMemGetInfo`); `None` when it
/// cannot say.
#[cfg(feature = "cuda")]
pub(crate) fn free_memory(ordinal: usize) -> Option<u64> {
    // Retains the same primary context Burn uses, so this costs no second context.
    let context = cudarc::driver::CudaContext::new(ordinal).ok()?;
    let (free, _total) = context.mem_get_info().ok()?;
    Some(free as u64)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn free_memory(_ordinal: usize) -> Option<u64> {
    None
}

/// Where cubecl looks for libdevice (`CUDA_PATH` alone when set, else the usual roots), and the
/// file if it is there.
#[cfg(feature = "cuda")]
fn libdevice() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let bitcode = |root: PathBuf| root.join("nvvm/libdevice/libdevice.10.bc");
    let path = match std::env::var_os("CUDA_PATH") {
        Some(root) => bitcode(PathBuf::from(root)),
        None => ["/usr/local/cuda", "/opt/cuda", "/usr/lib/cuda", "/usr"]
            .into_iter()
            .map(PathBuf::from)
            .find(|root| root.join("nvvm/libdevice").is_dir())
            .map(bitcode)?,
    };
    path.is_file().then_some(path)
}
