//! The Gemma-4 text model on MLX, at bit parity with mlx-lm 0.32.2:
//! config and checkpoint loading (HF and MLX-community layouts, bf16 and MLX-quantized), a
//! forward with a hidden-state tap, KV caches with rollback, and plain generation.
//!
//! ```no_run
//! use gemma4::generate::{generate, GenerateConfig};
//! use gemma4::tokenizer::{stop_tokens, Tokenizer};
//!
//! let dir = std::path::Path::new("gemma-4-e2b-it");
//! let model = gemma4::Model::load(dir)?;
//! let tok = Tokenizer::from_dir(dir)?;
//! let prompt = tok.encode("The capital of France is", true)?;
//! let cfg = GenerateConfig { max_tokens: 32, stop_tokens: stop_tokens(model.config(), Some(&tok)), ..Default::default() };
//! let out = generate(&model, &prompt, &cfg, |_| {})?;
//! println!("{}", tok.decode(&out.tokens)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod attention;
pub mod cache;
pub mod chat_markup;
pub mod chat_template;
pub mod checkpoint;
pub mod compute;
pub mod config;
mod error;
pub mod generate;
mod layer;
pub mod linear;
pub mod mask;
mod mlp;
mod model;
mod moe;
pub mod rope;
pub mod sampling;
pub mod staging;
pub mod step_profile;
mod tap;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use cache::{Cache, CacheError, LayerCache};
pub use compute::ComputeDtype;
pub use config::{LayerKind, TextConfig};
pub use error::{Error, Result};
pub use mlp::gelu;
pub use model::{ForwardOutput, Model};
#[cfg(feature = "testing")]
pub use moe::sorted_expert_calls;
pub use tap::{TapPoint, TapSet};
