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
    Mlx {
        /// The MLX op or bridge call that threw.
        op: &'static str,
        /// The C++ exception's `what()`.
        message: String,
        /// The Rust caller of the public function.
        location: &'static Location<'static>,
    },
    /// A host buffer does not fit the requested shape or dtype.
    #[error("{op}: {detail}")]
    Host {
        /// The function that rejected the buffer.
        op: &'static str,
        /// What did not fit.
        detail: String,
    },
    /// Element type requested from an array of another dtype.
    #[error("{op}: array has dtype {got}, expected {expected}")]
    Dtype {
        /// The function that read the array.
        op: &'static str,
        /// The dtype of the requested host element type.
        expected: crate::Dtype,
        /// The array's dtype.
        got: crate::Dtype,
    },
    /// A dtype code MLX returned that this crate does not model.
    #[error("MLX returned unknown dtype code {0}")]
    UnknownDtype(i32),
    /// A safetensors file could not be read or written.
    #[error("{path}: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// MLX's or this crate's reason.
        message: String,
    },
    /// A closure differentiated by `value_and_grad`/`vjp` panicked or failed without a typed error.
    #[error("{op}: {message}")]
    Closure {
        /// `value_and_grad` or `vjp`.
        op: &'static str,
        /// The panic payload or the closure's error, as text.
        message: String,
    },
    /// Filesystem error with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory the operation concerned.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a bridge exception, naming the op and the caller of the public function.
#[track_caller]
pub(crate) fn mlx_err(op: &'static str, e: cxx::Exception) -> Error {
    Error::Mlx { op, message: e.what().to_string(), location: Location::caller() }
}
