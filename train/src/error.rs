//! Errors of the training crate.

use std::path::PathBuf;

/// Errors from optimizers and training state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An MLX op failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The target model failed (loading, forward, checkpoint files).
    #[error(transparent)]
    Checkpoint(#[from] gemma4::Error),
    /// The drafter or the decode loop failed (forward, loss, checkpoint).
    #[error(transparent)]
    Drafter(#[from] spec_decode::Error),
    /// Parameters, gradients and moments must line up one to one, with equal shapes.
    #[error("{what}: {detail}")]
    Mismatch {
        /// Which list or array.
        what: &'static str,
        /// How they differ.
        detail: String,
    },
    /// A training-state directory is missing a file or holds something else.
    #[error("{}: {detail}", path.display())]
    State {
        /// The state directory or file.
        path: PathBuf,
        /// What is missing or wrong.
        detail: String,
    },
    /// An option, input line or output directory was refused: `what` names it (a field, an
    /// option, `file:line`), `detail` says what was expected.
    #[error("{what}: {detail}")]
    Invalid {
        /// The field, option or `file:line`.
        what: String,
        /// What was expected.
        detail: String,
    },
    /// An output directory holds other or inconsistent work: going on would mean starting
    /// over, which the caller must ask for (`force`).
    #[error("{what}: {detail}")]
    NeedsForce {
        /// The output directory or file.
        what: String,
        /// What is there and why going on would start over.
        detail: String,
    },
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
