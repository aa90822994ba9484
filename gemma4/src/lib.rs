//! The Gemma-4 text model on MLX.
#![forbid(unsafe_code)]
