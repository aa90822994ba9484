//! One error type for the crate. MLX reports failures as C++ exceptions carrying only a string,
//! so `Mlx` is the one string-bodied variant; it also names the op and the Rust caller.

use std::panic::Location;
use std::path::PathBuf;

/// Errors from mlx-core.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// MLX threw while building or evaluating `op`.
    #[error("mlx {op} failed at {location}: {message}")]
    Mlx { op: &'static str, message: String, location: &'static Location<'static> },
    /// A host buffer does not fit the requested shape or dtype.
    #[error("{op}: {detail}")]
    Host { op: &'static str, detail: String },
    /// Element type requested from an array of another dtype.
    #[error("{op}: array has dtype {got}, expected {expected}")]
    Dtype { op: &'static str, expected: crate::Dtype, got: crate::Dtype },
    /// A dtype code MLX returned that this crate does not model.
    #[error("MLX returned unknown dtype code {0}")]
    UnknownDtype(i32),
    /// A safetensors file could not be read or written.
    #[error("{path}: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// A closure differentiated by `value_and_grad`/`vjp` panicked or failed without a typed error.
    #[error("{op}: {message}")]
    Closure { op: &'static str, message: String },
    /// Filesystem error with the path it concerns.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a bridge exception, naming the op and the caller of the public function.
#[track_caller]
pub(crate) fn mlx_err(op: &'static str, e: cxx::Exception) -> Error {
    Error::Mlx { op, message: e.what().to_string(), location: Location::caller() }
}
