//! Element types. The bridge's shared `DtypeCode` carries them to C++ by name.

use std::fmt;
use std::str::FromStr;

use crate::sys::ffi::DtypeCode;

/// An MLX element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// Boolean, one byte per element.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer; the packed word of quantized weights.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer; token ids and indices.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// IEEE single precision; the host-side type for logits, statistics and training state.
    F32,
    /// IEEE double precision.
    F64,
    /// bfloat16; the dtype Gemma-4 checkpoints and the compute path use.
    Bf16,
    /// Complex of two f32s.
    C64,
}

impl Dtype {
    const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::U16,
        Dtype::U32,
        Dtype::U64,
        Dtype::I8,
        Dtype::I16,
        Dtype::I32,
        Dtype::I64,
        Dtype::F16,
        Dtype::F32,
        Dtype::F64,
        Dtype::Bf16,
        Dtype::C64,
    ];

    pub(crate) fn code(self) -> DtypeCode {
        match self {
            Dtype::Bool => DtypeCode::Bool,
            Dtype::U8 => DtypeCode::U8,
            Dtype::U16 => DtypeCode::U16,
            Dtype::U32 => DtypeCode::U32,
            Dtype::U64 => DtypeCode::U64,
            Dtype::I8 => DtypeCode::I8,
            Dtype::I16 => DtypeCode::I16,
            Dtype::I32 => DtypeCode::I32,
            Dtype::I64 => DtypeCode::I64,
            Dtype::F16 => DtypeCode::F16,
            Dtype::F32 => DtypeCode::F32,
            Dtype::F64 => DtypeCode::F64,
            Dtype::Bf16 => DtypeCode::Bf16,
            Dtype::C64 => DtypeCode::C64,
        }
    }

    pub(crate) fn from_code(code: DtypeCode) -> crate::Result<Dtype> {
        Self::ALL.iter().copied().find(|d| d.code() == code).ok_or(crate::Error::UnknownDtype(code.repr))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 8,
        }
    }

    /// True for f16, bf16, f32, f64.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64)
    }

    /// The name safetensors uses in its header (`"BF16"`, `"F32"`, ...).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::U16 => "U16",
            Dtype::U32 => "U32",
            Dtype::U64 => "U64",
            Dtype::I8 => "I8",
            Dtype::I16 => "I16",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::Bf16 => "BF16",
            Dtype::C64 => "C64",
        }
    }

    /// Lower-case name as MLX and config files spell it (`"bfloat16"`, `"float32"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U8 => "uint8",
            Dtype::U16 => "uint16",
            Dtype::U32 => "uint32",
            Dtype::U64 => "uint64",
            Dtype::I8 => "int8",
            Dtype::I16 => "int16",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::Bf16 => "bfloat16",
            Dtype::C64 => "complex64",
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for an unknown dtype name.
#[derive(Debug, thiserror::Error)]
#[error("unknown dtype {0:?} (expected e.g. \"bfloat16\", \"float16\", \"float32\")")]
pub struct ParseDtypeError(pub String);

impl FromStr for Dtype {
    type Err = ParseDtypeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let l = s.to_ascii_lowercase();
        Self::ALL
            .iter()
            .copied()
            .find(|d| d.as_str() == l || d.safetensors_name().eq_ignore_ascii_case(&l))
            .or(match l.as_str() {
                "bf16" => Some(Dtype::Bf16),
                "f16" | "half" => Some(Dtype::F16),
                "f32" | "float" => Some(Dtype::F32),
                _ => None,
            })
            .ok_or_else(|| ParseDtypeError(s.to_string()))
    }
}

/// Host element types that can be copied in and out of arrays.
pub trait Element: Copy + Default + 'static {
    /// The MLX dtype matching this host type.
    const DTYPE: Dtype;
    /// Decodes one element from its little-endian bytes (`b.len()` = the element's size).
    fn from_le_bytes(b: &[u8]) -> Self;
    /// Appends this element's little-endian bytes to `out`.
    fn extend_le_bytes(self, out: &mut Vec<u8>);
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: Dtype = $d;
            fn from_le_bytes(b: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn extend_le_bytes(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    };
}

element!(u8, Dtype::U8);
element!(u16, Dtype::U16);
element!(u32, Dtype::U32);
element!(u64, Dtype::U64);
element!(i8, Dtype::I8);
element!(i16, Dtype::I16);
element!(i32, Dtype::I32);
element!(i64, Dtype::I64);
element!(f32, Dtype::F32);
element!(f64, Dtype::F64);

impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
    fn from_le_bytes(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn extend_le_bytes(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every dtype crosses the bridge and comes back as itself (the C++ side maps the shared
    /// enum to MLX's dtypes by name in both directions), with MLX's element size.
    #[test]
    fn every_dtype_round_trips_through_mlx() {
        for d in Dtype::ALL {
            let a = crate::Array::zeros(&[3], d).unwrap();
            assert_eq!(a.dtype(), d, "{d}");
            assert_eq!(a.nbytes(), 3 * d.size(), "{d}");
            assert_eq!(Dtype::from_code(d.code()).unwrap(), d);
        }
    }
}
