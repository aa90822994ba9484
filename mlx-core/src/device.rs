//! Device and stream selection. MLX runs every op on the calling thread's default stream of
//! the default device; binaries pick the device once at start-up, and a separate stream lets
//! independent work be queued apart from the default one.

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
    fn code(self) -> ffi::DeviceKind {
        match self {
            Device::Cpu => ffi::DeviceKind::Cpu,
            Device::Gpu => ffi::DeviceKind::Gpu,
        }
    }

    /// Whether this build of MLX has the backend.
    pub fn is_available(self) -> bool {
        ffi::device_available(self.code()).unwrap_or(false)
    }

    /// The device ops currently run on.
    pub fn default_device() -> Result<Device> {
        let c = ffi::default_device().map_err(|e| mlx_err("default_device", e))?;
        Ok(if c == ffi::DeviceKind::Cpu { Device::Cpu } else { Device::Gpu })
    }

    /// Makes this the default device for subsequent ops.
    #[track_caller]
    pub fn set_default(self) -> Result<()> {
        ffi::set_default_device(self.code()).map_err(|e| mlx_err("set_default_device", e))
    }
}

/// An MLX stream: an ordered queue of work on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    index: i32,
    device: Device,
}

impl Stream {
    /// A new stream on `device`.
    #[track_caller]
    pub fn new(device: Device) -> Result<Stream> {
        let index = ffi::new_stream(device.code()).map_err(|e| mlx_err("new_stream", e))?;
        Ok(Stream { index, device })
    }

    /// The calling thread's default stream on `device`.
    #[track_caller]
    pub fn default_for(device: Device) -> Result<Stream> {
        let index = ffi::default_stream(device.code()).map_err(|e| mlx_err("default_stream", e))?;
        Ok(Stream { index, device })
    }

    /// The device the stream runs on.
    pub fn device(self) -> Device {
        self.device
    }

    /// Makes this the calling thread's default stream for its device: ops built afterwards on
    /// that device are queued here.
    #[track_caller]
    pub fn set_default(self) -> Result<()> {
        ffi::set_default_stream(self.index, self.device.code()).map_err(|e| mlx_err("set_default_stream", e))
    }

    /// Blocks until everything queued on this stream has run.
    #[track_caller]
    pub fn synchronize(self) -> Result<()> {
        ffi::synchronize_stream(self.index, self.device.code()).map_err(|e| mlx_err("synchronize", e))
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
