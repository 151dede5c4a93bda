//! `--backend`: which Burn backend runs the model, chosen at run time (Burn 0.22's `Device`).

use anyhow::{Result, bail};
use burn::tensor::{Device, DeviceType};

/// A backend as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A GPU through wgpu when one is present; else `fused`.
    Auto,
    /// Training steps, loss estimates and sampling by tinygpt's fused CPU kernels (hand-written
    /// forward and backward, AVX-512 matmuls when the CPU has them, every core); the optimizer
    /// and the other commands on flex.
    Fused,
    /// Burn's flex CPU backend (the faster of Burn's CPU backends).
    Flex,
    /// Burn's ndarray CPU backend.
    Ndarray,
    /// wgpu: Vulkan, Metal or DX12 (a software Vulkan such as lavapipe counts).
    Wgpu,
}

impl Backend {
    /// The device for this backend, or an error when wgpu has no adapter.
    pub fn device(self) -> Result<Device> {
        Ok(match self {
            Self::Flex | Self::Fused => Device::flex(),
            Self::Ndarray => ndarray(),
            Self::Wgpu => match wgpu_devices().into_iter().next() {
                Some(device) => device,
                None => bail!(
                    "--backend wgpu: no wgpu adapter found (no GPU driver, and no software Vulkan \
                     such as Mesa's lavapipe); use --backend flex"
                ),
            },
            Self::Auto => physical_gpu().unwrap_or_else(Device::flex),
        })
    }
}

impl Backend {
    /// What `auto` means for training on this machine: a physical GPU stays `Auto` (its
    /// device is that GPU), no GPU means `Fused`.
    pub fn resolve(self) -> Self {
        match self {
            Self::Auto if physical_gpu().is_none() => Self::Fused,
            other => other,
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
/// on a CPU, the CPU backends are faster than wgpu over it.
fn physical_gpu() -> Option<Device> {
    wgpu_devices()
        .into_iter()
        .find(|d| d.identity().is_some_and(|id| id.physical.is_some()))
}

fn wgpu_devices() -> Vec<Device> {
    Device::enumerate(DeviceType::Wgpu).into_vec()
}

/// burn-ndarray is deprecated upstream in favour of flex; tinygpt still offers it.
#[allow(deprecated)]
fn ndarray() -> Device {
    Device::ndarray()
}
