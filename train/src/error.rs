//! Errors of the training crate.

use std::path::PathBuf;

/// Errors from optimizers and training state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error(transparent)]
    Checkpoint(#[from] gemma4::Error),
    /// The drafter or the decode loop failed (forward, loss, checkpoint).
    #[error(transparent)]
    Drafter(#[from] spec_decode::Error),
    /// Parameters, gradients and moments must line up one to one, with equal shapes.
    #[error("{what}: {detail}")]
    Mismatch { what: &'static str, detail: String },
    /// A training-state directory is missing a file or holds something else.
    #[error("{}: {detail}", path.display())]
    State { path: PathBuf, detail: String },
    /// An option, input line or output directory was refused: `what` names it (a field, an
    /// option, `file:line`), `detail` says what was expected.
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    /// An output directory holds other or inconsistent work: going on would mean starting
    /// over, which the caller must ask for (`force`).
    #[error("{what}: {detail}")]
    NeedsForce { what: String, detail: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
