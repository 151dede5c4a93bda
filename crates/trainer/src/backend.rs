//! `--backend`: which Burn backend runs the model, chosen at run time (Burn 0.22's `Device`).

use anyhow::{Result, bail};
use burn::tensor::{Device, DeviceType};

/// A backend as named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// A GPU through wgpu when one is present, else flex.
    Auto,
    /// Burn's flex CPU backend (the faster CPU backend).
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
            Self::Flex => Device::flex(),
            Self::Ndarray => ndarray(),
            Self::Wgpu => match wgpu_devices().into_iter().next() {
                Some(device) => device,
                None => bail!(
                    "--backend wgpu: no wgpu adapter found (no GPU driver, and no software Vulkan \
                     such as Mesa's lavapipe); use --backend flex"
                ),
            },
            Self::Auto => wgpu_devices()
                .into_iter()
                // A software rasterizer is no card: on a CPU, flex is faster than wgpu over it.
                .find(|d| d.identity().is_some_and(|id| id.physical.is_some()))
                .unwrap_or_else(Device::flex),
        })
    }
}

/// A short description of `device` for logs.
pub fn describe(device: &Device) -> String {
    match device.identity() {
        Some(id) => format!("{device:?} ({})", id.name),
        None => format!("{device:?}"),
    }
}

fn wgpu_devices() -> Vec<Device> {
    Device::enumerate(DeviceType::Wgpu).into_vec()
}

/// burn-ndarray is deprecated upstream in favour of flex; tinygpt still offers it.
#[allow(deprecated)]
fn ndarray() -> Device {
    Device::ndarray()
}
