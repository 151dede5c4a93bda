//! `--backend`: where the model runs and which engine trains it, chosen at run time.
//!
//! A backend name is a shorthand for two settings, a [`Placement`]: the Burn device (Burn 0.22's
//! run-time `Device`) and the [`EngineKind`] that trains on it (Burn's autodiff on the host or on
//! a device, or tinygpt's fused CPU engine). [`Placement::engine_for`] is the one place that
//! decides, for a step's dtype and optimizer, which engine runs.

pub mod cuda;
pub mod host;
pub mod kernels;
pub mod switches;

use anyhow::{Result, bail};
use burn::tensor::{Device, DeviceKind, DeviceType};
use tinygpt_model::Gpt;

use crate::config::{OptimizerKind, TrainDType, UpdateKind};
use switches::Switches;

/// A backend as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A CUDA GPU when tinygpt is built with CUDA and one answers; else a GPU through wgpu;
    /// else `fused` (or flex for a step the fused engine does not run: not f32).
    Auto,
    /// tinygpt's fused CPU engine for training steps, loss estimates and sampling (hand-written
    /// forward and backward, AVX-512 matmuls when the CPU has them, every core); the other
    /// commands on flex.
    Fused,
    /// Burn's flex CPU backend (the faster of Burn's CPU backends).
    Flex,
    /// Burn's ndarray CPU backend.
    Ndarray,
    /// wgpu: Vulkan, Metal or DX12 (a software Vulkan such as lavapipe counts), with kernel
    /// fusion and autotuned kernels.
    Wgpu,
    /// Burn's CUDA backend on an NVIDIA GPU (the first that `CUDA_VISIBLE_DEVICES` shows), with
    /// kernel fusion and autotuned kernels; needs a build with `--features cuda`.
    Cuda,
}

/// Whose memory a device uses, and who can say how much of it is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// The host's: the CPU backends.
    Host,
    /// CUDA GPU `n`'s: the driver reports what is free.
    Cuda(usize),
    /// A wgpu device's: wgpu cannot report it.
    Unreported,
}

/// Where a model runs and what trains it.
#[derive(Debug, Clone)]
pub struct Placement {
    pub device: Device,
    /// The device's backend in the fixed form logs and tests read: `flex`, `ndarray`, `wgpu` or
    /// `cuda` (what `auto` resolved to).
    pub device_name: &'static str,
    /// The engine this backend trains with.
    pub engine: EngineKind,
    /// With [`EngineKind::Fused`]: whether a step the fused engine does not run (not f32) is an
    /// error (`--backend fused`), rather than trained by Burn's autodiff on flex (`auto`).
    pub strict: bool,
    pub memory: Memory,
    /// Why `auto` passed over a GPU that is present, when it did.
    pub note: Option<String>,
    /// The switches for measuring ([`switches`]): how a model runs here where several ways
    /// give the same numbers. Applied to every model placed here ([`Placement::model`]).
    pub switches: Switches,
}

impl Placement {
    /// Where `auto` runs on a machine without a GPU: the fused CPU engine for a model it
    /// implements, flex for any other.
    pub fn cpu() -> Self {
        Self {
            device: Device::flex(),
            device_name: "flex",
            engine: EngineKind::Fused,
            strict: false,
            memory: Memory::Host,
            note: None,
            switches: Switches::default(),
        }
    }

    /// `model` (on this placement's device, or its autodiff form) running as the switches say.
    pub fn model(&self, model: Gpt) -> Gpt {
        self.switches.apply(model)
    }

    /// Whether the device is the CPU: a read back from it costs no wait for another processor.
    pub fn on_host(&self) -> bool {
        self.memory == Memory::Host
    }

    /// Bytes the device can still allocate, where that can be known.
    pub(crate) fn available_memory(&self) -> Option<u64> {
        match self.memory {
            Memory::Host => host::available_bytes(),
            Memory::Cuda(ordinal) => cuda::free_memory(ordinal),
            Memory::Unreported => None,
        }
    }

    /// The engine for a model here: the one place that decides it (the memory estimate,
    /// training and sampling all ask). The fused engine implements every architecture; with
    /// `auto`, a step it cannot run (not f32) trains on Burn's autodiff and the note says why,
    /// and an explicit `fused` refuses it.
    ///
    /// `dtype` is the training step's: the fused engine computes in f32 only, and a device
    /// without `dtype`'s arithmetic is an error that names what has it. `[lora] dropout`
    /// (computed by the fused engine alone) on another engine is an error too.
    pub fn engine_for(
        &self,
        dtype: TrainDType,
        update: impl Into<UpdateKind>,
    ) -> Result<(EngineKind, Option<String>)> {
        let update = update.into();
        let support = match dtype {
            TrainDType::F32 => Ok(()),
            _ => Err(format!(
                "the fused CPU engine computes in f32 only, not train.dtype = \"{}\"",
                dtype.name()
            )),
        };
        if dtype != TrainDType::F32 && !self.device.supports_dtype(dtype.float()) {
            bail!(
                "train.dtype = \"{}\" is not supported on {:?}: bf16 and f16 train on cuda and \
                 flex, f16 on wgpu where the GPU has it (never bf16: WGSL has none), f32 on \
                 every backend",
                dtype.name(),
                self.device
            );
        }
        let decided = match (self.engine, support) {
            (EngineKind::Fused, Ok(())) => (EngineKind::Fused, None),
            (EngineKind::Fused, Err(e)) if self.strict => bail!("{e}"),
            (EngineKind::Fused, Err(e)) => {
                (EngineKind::Autodiff, Some(format!("{e}; training on flex")))
            }
            (EngineKind::Device, _) if update.optimizer == OptimizerKind::Muon => (
                EngineKind::Autodiff,
                Some("Muon updates through Burn's optimizer on the device".into()),
            ),
            (EngineKind::Device, _) if update.lora => (
                EngineKind::Autodiff,
                Some("LoRA adapters update through Burn's optimizer on the device".into()),
            ),
            (EngineKind::Device, _) if update.lr_groups => (
                EngineKind::Autodiff,
                Some(
                    "learning rates of their own (train.*_lr_ratio) update through Burn's \
                     optimizer on the device"
                        .into(),
                ),
            ),
            (kind @ (EngineKind::Autodiff | EngineKind::Device), _) => (kind, None),
        };
        if update.lora_dropout && dtype != TrainDType::F32 {
            bail!(
                "[lora] dropout needs train.dtype = \"f32\": a {} step multiplies by casts of the \
                 weights with the adapters merged in, where no adapter input is left to drop \
                 (train in f32, or set lora.dropout = 0)",
                dtype.name()
            );
        }
        Ok(decided)
    }
}

/// What computes a model's losses, gradients, updates and samples: what a backend asks for
/// ([`Placement::engine`]) and [`Placement::engine_for`] decides for a model. Each is one
/// implementation of the training engine (`train::engine`); [`EngineKind::name`] is how the run's
/// log and `tinygpt info` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// tinygpt's fused CPU engine, and its decoder.
    Fused,
    /// Burn's autodiff and Burn's optimizer (AdamW, or Muon beside it) on the CPU, or on a GPU
    /// for Muon; Burn's decoder.
    Autodiff,
    /// Burn's autodiff on a GPU, AdamW on the device where the non-finite guard decides too
    /// (Muon goes to [`Autodiff`](Self::Autodiff)); Burn's decoder.
    Device,
}

impl EngineKind {
    /// The engine's name in the fixed form the run's log (`engine: NAME`) and `tinygpt info`
    /// print it: `fused`, `autodiff` or `device`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::Autodiff => "autodiff",
            Self::Device => "device",
        }
    }

    /// What `info` and `params` call where `auto` trains on a machine without a GPU.
    pub fn on_the_cpu(self) -> &'static str {
        match self {
            Self::Fused => "fused engine",
            Self::Autodiff | Self::Device => "flex",
        }
    }
}

impl Backend {
    /// The device and engine this backend means on this machine; a GPU backend without its
    /// device is an error.
    pub fn placement(self) -> Result<Placement> {
        self.placement_for(0)
    }

    /// [`placement`](Self::placement) for the `local_rank`-th of the ranks on this host: a GPU
    /// backend takes the host's GPU `local_rank mod count` of its kind, one GPU a rank when a
    /// host runs as many ranks as it has GPUs.
    pub fn placement_for(self, local_rank: usize) -> Result<Placement> {
        kernels::keep_between_runs();
        // The device, its name, the engine, and what says how much memory the device has.
        let fused = (Device::flex(), "flex", EngineKind::Fused, Memory::Host);
        let mut note = None;
        let (device, device_name, engine, memory) = match self {
            Self::Fused => fused,
            Self::Flex => (Device::flex(), "flex", EngineKind::Autodiff, Memory::Host),
            Self::Ndarray => (ndarray(), "ndarray", EngineKind::Autodiff, Memory::Host),
            Self::Wgpu => match nth(wgpu_devices(), local_rank) {
                Some(device) => (device, "wgpu", EngineKind::Device, Memory::Unreported),
                None => bail!(
                    "--backend wgpu: no wgpu adapter found (no GPU driver, and no software Vulkan \
                     such as Mesa's lavapipe); use --backend flex"
                ),
            },
            Self::Cuda => {
                let (device, ordinal) = cuda::device(local_rank)?;
                (device, "cuda", EngineKind::Device, Memory::Cuda(ordinal))
            }
            Self::Auto => match cuda::device(local_rank) {
                Ok((device, ordinal)) => {
                    (device, "cuda", EngineKind::Device, Memory::Cuda(ordinal))
                }
                Err(why) => {
                    // A GPU that is there but cannot run is worth a word; no driver is not.
                    if why == cuda::Unavailable::NoLibdevice {
                        note = Some(format!("{why}; auto takes the next backend"));
                    }
                    match physical_gpu(local_rank) {
                        Some(gpu) => (gpu, "wgpu", EngineKind::Device, Memory::Unreported),
                        None => fused,
                    }
                }
            },
        };
        Ok(Placement {
            device,
            device_name,
            engine,
            // Only an explicit `--backend fused` insists on the fused engine.
            strict: self == Self::Fused,
            memory,
            note,
            switches: Switches::from_env(),
        })
    }

    /// The backend [`name`](Self::name) names (as a run's `state.json` records it), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(name, true).ok()
    }

    /// The name as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fused => "fused",
            Self::Flex => "flex",
            Self::Ndarray => "ndarray",
            Self::Wgpu => "wgpu",
            Self::Cuda => "cuda",
        }
    }
}

/// A short description of `device` for logs.
pub fn describe(device: &Device) -> String {
    match device.identity() {
        Some(id) => format!("{device:?} ({})", id.name),
        None => format!("{device:?}"),
    }
}

/// The first wgpu adapter that is a card. A software rasterizer (lavapipe, llvmpipe) is not:
/// on a CPU, the CPU backends are faster than wgpu over it. Asked of the adapter list by kind,
/// without opening a device: an opened one keeps its driver's threads for the life of the
/// process (a software Vulkan's poll thread costs an idle `serve` a tenth of a core).
fn physical_gpu(local_rank: usize) -> Option<Device> {
    let listed = wgpu_devices();
    let kinds: [fn(usize) -> DeviceKind; 3] = [
        DeviceKind::DiscreteGpu,
        DeviceKind::IntegratedGpu,
        DeviceKind::VirtualGpu,
    ];
    kinds.into_iter().find_map(|kind| {
        let cards = (0..listed.len()).map(|i| Device::wgpu(kind(i)));
        nth(
            cards.filter(|card| listed.contains(card)).collect(),
            local_rank,
        )
    })
}

/// Device `local_rank mod count` of `devices`, `None` when there are none.
fn nth(devices: Vec<Device>, local_rank: usize) -> Option<Device> {
    let count = devices.len();
    devices.into_iter().nth(local_rank.checked_rem(count)?)
}

fn wgpu_devices() -> Vec<Device> {
    Device::enumerate(DeviceType::Wgpu).into_vec()
}

/// burn-ndarray is deprecated upstream in favour of flex; tinygpt still offers it.
#[allow(deprecated)]
fn ndarray() -> Device {
    Device::ndarray()
}
