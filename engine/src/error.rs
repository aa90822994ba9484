//! Errors of the engine and the sessions. Request validation has its own type
//! ([`crate::api_error::ApiError`]), which is what a client sees.

use std::path::PathBuf;

/// What can fail while loading or decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error(transparent)]
    Model(#[from] gemma4::Error),
    #[error(transparent)]
    Decode(#[from] spec_decode::Error),
    #[error(transparent)]
    Tokenizer(#[from] gemma4::tokenizer::TokenizerError),
    #[error(transparent)]
    Template(#[from] gemma4::chat_template::ChatTemplateError),
    /// A checkpoint (model or drafter) could not be loaded.
    #[error("loading {}: {detail}", path.display())]
    Load { path: PathBuf, detail: String },
    /// Settings that cannot work together (`what` names the setting).
    #[error("{what}: {detail}")]
    Settings { what: &'static str, detail: String },
    /// The engine's worker is gone (it stopped, or failed to start).
    #[error("the engine is not running: {0}")]
    EngineStopped(String),
    /// A request's decoding panicked; the worker caught it and goes on.
    #[error("internal error while decoding: {0}")]
    Panicked(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
