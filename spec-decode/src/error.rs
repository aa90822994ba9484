//! Errors of the spec-decode crate. Sources are kept as chains, never re-stringified.

use std::path::PathBuf;

/// Errors from drafters, checkpoints and the decode loop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The target model failed (loading, forward, cache).
    #[error(transparent)]
    Target(#[from] gemma4::Error),
    /// An MLX op failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The verifier refused its inputs.
    #[error(transparent)]
    Accept(#[from] crate::verify::accept::AcceptError),
    /// A drafter's `config.json` is malformed (the error names the file and the key).
    #[error(transparent)]
    Config(#[from] gemma4::config::ConfigError),
    /// A drafter checkpoint is malformed or of the wrong kind; `detail` says what was expected.
    #[error("{}: {detail}", path.display())]
    Checkpoint {
        /// The checkpoint file or directory.
        path: PathBuf,
        /// What was expected.
        detail: String,
    },
    /// The drafter does not fit the target (hidden size, vocabulary, tap layers, depth).
    #[error("drafter {drafter} does not fit the target: {detail}")]
    Incompatible {
        /// The drafter's name.
        drafter: String,
        /// Which dimension does not fit, and how.
        detail: String,
    },
    /// Bad decode settings (γ, thresholds, sampler).
    #[error("{field}: {detail}")]
    Settings {
        /// The setting's name.
        field: &'static str,
        /// Why it is refused.
        detail: String,
    },
    /// A drafter broke its contract (e.g. proposed more drafts than asked).
    #[error("drafter contract: {0}")]
    Contract(String),
    /// Filesystem error with the path it concerns.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn checkpoint(path: &std::path::Path, detail: impl Into<String>) -> Error {
        Error::Checkpoint { path: path.to_path_buf(), detail: detail.into() }
    }
}
