//! Quantizing drafter checkpoints (MLX affine, mlx-community layout).
//!
//! The quantizer lands with the drafter-quant issue; the crate exists now so the workspace
//! shape is fixed from the start.
#![forbid(unsafe_code)]
