//! Device selection. MLX runs every op on the default device's default stream unless told
//! otherwise; binaries pick the device once at start-up.

use crate::error::{mlx_err, Result};
use crate::sys::ffi;

/// Where MLX runs ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (every build).
    Cpu,
    /// The GPU backend: Metal on Apple Silicon, CUDA with the mlx-cuda wheels.
    Gpu,
}

impl Device {
    fn code(self) -> i32 {
        match self {
            Device::Cpu => 0,
            Device::Gpu => 1,
        }
    }

    /// Whether this build of MLX has the backend.
    pub fn is_available(self) -> bool {
        ffi::device_available(self.code()).unwrap_or(false)
    }

    /// The device ops currently run on.
    pub fn default_device() -> Result<Device> {
        let c = ffi::default_device().map_err(|e| mlx_err("default_device", e))?;
        Ok(if c == 0 { Device::Cpu } else { Device::Gpu })
    }

    /// Makes this the default device for subsequent ops.
    #[track_caller]
    pub fn set_default(self) -> Result<()> {
        ffi::set_default_device(self.code()).map_err(|e| mlx_err("set_default_device", e))
    }
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "gpu" | "metal" | "cuda" => Ok(Device::Gpu),
            other => Err(format!("unknown device {other:?} (expected cpu or gpu)")),
        }
    }
}
