//! Errors of the spec-decode crate. Sources are kept as chains, never re-stringified.

use std::path::PathBuf;

/// Errors from drafters, checkpoints and the decode loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Target(#[from] gemma4::Error),
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error(transparent)]
    Accept(#[from] crate::verify::accept::AcceptError),
    /// A drafter's `config.json` is malformed (the error names the file and the key).
    #[error(transparent)]
    Config(#[from] gemma4::config::ConfigError),
    /// A drafter checkpoint is malformed or of the wrong kind; `detail` says what was expected.
    #[error("{}: {detail}", path.display())]
    Checkpoint { path: PathBuf, detail: String },
    /// The drafter does not fit the target (hidden size, vocabulary, tap layers, depth).
    #[error("drafter {drafter} does not fit the target: {detail}")]
    Incompatible { drafter: String, detail: String },
    /// Bad decode settings (γ, thresholds, sampler).
    #[error("{field}: {detail}")]
    Settings { field: &'static str, detail: String },
    /// A drafter broke its contract (e.g. proposed more drafts than asked).
    #[error("drafter contract: {0}")]
    Contract(String),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn checkpoint(path: &std::path::Path, detail: impl Into<String>) -> Error {
        Error::Checkpoint { path: path.to_path_buf(), detail: detail.into() }
    }
}
