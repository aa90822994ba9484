//! RAII arrays and the ops dspark's models need, bound to MLX's C++ API.
//!
//! MLX is lazy: ops build a graph and nothing runs until you `eval` or read data back.
//!
//! ```
//! use mlx_core::{Array, Dtype};
//! let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3])?;
//! let b = a.mul_scalar(2.0)?.add_scalar(1.0)?; // nothing computed yet
//! assert_eq!(b.to_vec::<f32>()?, vec![3.0, 5.0, 7.0]); // evaluates
//! assert_eq!(Array::scalar(39.1918, Dtype::Bf16)?.to_f32_vec()?, vec![39.25]); // weak scalar
//! # Ok::<(), mlx_core::Error>(())
//! ```
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

mod array;
mod autodiff;
pub mod blas;
mod device;
mod dtype;
mod error;
pub mod fast;
pub mod files;
mod io;
mod ops;
pub mod quant;
pub mod random;
pub mod row_cache;
pub mod row_confidence;
pub mod row_layer;
pub mod row_markov;
pub mod row_sample;
mod sys;

pub use array::{async_eval, eval, mlx_version, pending_nodes, synchronize, Array};
pub use autodiff::{value_and_grad, vjp};
pub use device::{Device, Stream};
pub use dtype::{Dtype, Element, ParseDtypeError};
pub use error::{Error, Result};
pub use io::{load_safetensors, save_safetensors, SafetensorsFile};
pub use ops::{concatenate, gelu_approx, where_};

/// The MLX directory this crate was built against (from the build script).
pub const MLX_DIR: &str = env!("MLX_CORE_MLX_DIR");
/// The MLX version of the headers this crate was compiled with.
pub const MLX_VERSION: &str = env!("MLX_CORE_MLX_VERSION");
