//! The dtype a model computes in, chosen at load time (files on disk are never touched).
//!
//! On a CPU, f32 is the fast path: MLX's f32 matmuls go to the optimized BLAS that mlx-core
//! links (≈150 GFLOP/s on two x86 cores), while its bf16 kernels run at ≈5 GFLOP/s and its
//! 4-bit kernels slower still. `Auto` therefore computes in f32 on the CPU — dequantizing
//! MLX-affine weights at load — whenever the f32 copy fits comfortably in memory, and keeps
//! the checkpoint's own dtype (and quantization) on a GPU or when memory is short.

use std::fmt;
use std::str::FromStr;

use mlx_core::{Device, Dtype};

/// What `--dtype` asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ComputeDtype {
    /// f32 (dequantized) on the CPU when it fits in half the available memory, else as stored.
    #[default]
    Auto,
    /// The checkpoint's own dtype and quantization.
    Stored,
    /// Everything dense in f32 (quantized weights are dequantized).
    F32,
    /// Dense tensors in bf16 (quantized weights stay quantized, their scales in bf16).
    Bf16,
    /// Dense tensors in f16 (quantized weights stay quantized, their scales in f16).
    F16,
}

impl FromStr for ComputeDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(ComputeDtype::Auto),
            "stored" | "as-stored" => Ok(ComputeDtype::Stored),
            "f32" | "float32" => Ok(ComputeDtype::F32),
            "bf16" | "bfloat16" => Ok(ComputeDtype::Bf16),
            "f16" | "float16" => Ok(ComputeDtype::F16),
            other => Err(format!("unknown dtype {other:?} (expected auto, stored, f32, bf16 or f16)")),
        }
    }
}

impl fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ComputeDtype::Auto => "auto",
            ComputeDtype::Stored => "stored",
            ComputeDtype::F32 => "f32",
            ComputeDtype::Bf16 => "bf16",
            ComputeDtype::F16 => "f16",
        })
    }
}

/// What loading does to the tensors: the resolved form of a [`ComputeDtype`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conversion {
    /// Cast every float tensor (and quantization scales/biases) to this dtype.
    pub cast: Option<Dtype>,
    /// Dequantize MLX-affine weights into dense ones (in `cast`'s dtype).
    pub dequantize: bool,
}

impl Conversion {
    /// Leave everything as stored.
    pub const NONE: Conversion = Conversion { cast: None, dequantize: false };

    /// Dense f32.
    pub const F32: Conversion = Conversion { cast: Some(Dtype::F32), dequantize: true };
}

/// Why `Auto` chose what it chose, for the one line a CLI prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The cast/dequantization `Auto` chose.
    pub conversion: Conversion,
    /// Bytes the dense f32 copy of the weights takes.
    pub f32_bytes: u64,
    /// Memory available when the choice was made (None where it cannot be read).
    pub available_bytes: Option<u64>,
    /// Whether the checkpoint holds quantized weights.
    pub quantized: bool,
    /// Whether 8- and 4-bit matrices stay packed for the CPU's packed row kernel (the rest is
    /// converted as `conversion` says).
    pub packed: bool,
}

impl Resolved {
    /// A short description: "f32 (dequantized, 1.0 GB)" or "as stored".
    pub fn describe(&self) -> String {
        match self.conversion.cast {
            None => "as stored".to_string(),
            Some(d) => format!(
                "{} ({:.2} GB of weights{})",
                d.as_str(),
                self.f32_bytes as f64 * d.size() as f64 / 4.0 / 1e9,
                match (self.quantized, self.packed, self.conversion.dequantize) {
                    (true, true, _) => ", 8/4-bit matrices read packed, others dequantized",
                    (true, false, true) => ", quantized weights dequantized",
                    _ => "",
                }
            ),
        }
    }
}

impl ComputeDtype {
    /// Resolves the choice for weights whose dense f32 copy takes `f32_bytes`, on `device`.
    pub fn resolve(self, f32_bytes: u64, quantized: bool, device: Device) -> Resolved {
        let available_bytes = available_memory();
        let conversion = match self {
            ComputeDtype::Stored => Conversion::NONE,
            ComputeDtype::F32 => Conversion::F32,
            ComputeDtype::Bf16 => Conversion { cast: Some(Dtype::Bf16), dequantize: false },
            ComputeDtype::F16 => Conversion { cast: Some(Dtype::F16), dequantize: false },
            ComputeDtype::Auto => {
                // Room to spare: the f32 copy may take at most half of what is free.
                let fits = available_bytes.is_none_or(|a| f32_bytes.saturating_mul(2) <= a);
                if device == Device::Cpu && fits {
                    Conversion::F32
                } else {
                    Conversion::NONE
                }
            }
        };
        Resolved { conversion, f32_bytes, available_bytes, quantized, packed: false }
    }
}

/// `MemAvailable` from /proc/meminfo (Linux); None elsewhere.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_resolves() {
        assert_eq!("F32".parse::<ComputeDtype>().unwrap(), ComputeDtype::F32);
        assert!("f64".parse::<ComputeDtype>().unwrap_err().contains("expected auto"));
        assert_eq!(ComputeDtype::Stored.resolve(1, false, Device::Cpu).conversion, Conversion::NONE);
        assert_eq!(ComputeDtype::Auto.resolve(1 << 20, false, Device::Cpu).conversion, Conversion::F32);
        assert_eq!(ComputeDtype::Auto.resolve(1 << 20, false, Device::Gpu).conversion, Conversion::NONE);
        // Far more than any machine has: keep as stored.
        if available_memory().is_some() {
            assert_eq!(ComputeDtype::Auto.resolve(u64::MAX / 4, false, Device::Cpu).conversion, Conversion::NONE);
        }
        let bf = ComputeDtype::Bf16.resolve(8, false, Device::Cpu).conversion;
        assert_eq!(bf, Conversion { cast: Some(Dtype::Bf16), dequantize: false });
    }
}
