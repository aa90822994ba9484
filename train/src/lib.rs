//! Training on MLX: AdamW, warmup + cosine learning-rate schedule, global-norm gradient
//! clipping, and a resumable training state (parameters, moments, step, RNG) written atomically.
//!
//! ```
//! use mlx_core::{value_and_grad, Array};
//! use train::{AdamW, AdamWConfig};
//! // Minimise (w − 3)².
//! let mut params = vec![Array::from_slice(&[0.0f32], &[])?];
//! let mut opt = AdamW::new(AdamWConfig { weight_decay: 0.0, ..Default::default() }, &params)?;
//! for _ in 0..200 {
//!     let (_, grads) = value_and_grad(|xs: &[Array]| Ok::<_, mlx_core::Error>(vec![xs[0].sub_scalar(3.0)?.square()?]), &params, &[0])?;
//!     params = opt.step(&params, &grads, 0.1)?;
//! }
//! assert!((params[0].to_vec::<f32>()?[0] - 3.0).abs() < 0.05);
//! # Ok::<(), train::Error>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod adamw;
pub(crate) mod analytic;
pub mod bpe;
mod clip;
pub mod corpus;
pub mod drafter_train;
mod error;
pub mod live;
pub mod lock;
pub mod prompts;
pub mod regen;
mod rng;
pub mod sampler;
mod schedule;
pub mod shards;
mod state;
pub mod target_checkpoint;
pub mod target_train;
pub mod tool_chat;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::clip_global_norm;
pub use error::{Error, Result};
pub use rng::SplitMix64;
pub use schedule::WarmupCosine;
pub use state::TrainState;
