//! Errors of the sessions, the engine and the choices the front ends share. The HTTP server
//! validates requests with its own type, which is what a client sees.

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
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// A checkpoint (model or drafter) could not be loaded.
    #[error("loading {}: {detail}", path.display())]
    Load { path: PathBuf, detail: String },
    /// Settings that cannot work together (`what` names the setting).
    #[error("{what}: {detail}")]
    Settings { what: &'static str, detail: String },
    /// `--device` names a backend this MLX build lacks.
    #[error("--device {device:?}: this MLX build has no such backend (MLX at {})", mlx_core::MLX_DIR)]
    NoBackend { device: mlx_core::Device },
    /// A drafter checkpoint where a target is expected (`flag` names the option).
    #[error(
        "{flag} {}: this is a {kind:?} drafter checkpoint, not a Gemma-4 target; pass it as --drafter (and a \
         target as {flag})",
        dir.display()
    )]
    DrafterAsModel { flag: &'static str, dir: PathBuf, kind: spec_decode::DrafterKind },
    /// `--drafter default` with a model other than the embedded default.
    #[error(
        "--drafter default belongs to the embedded default model; pass a drafter directory for --model {}",
        model.display()
    )]
    DefaultDrafterForModel { model: PathBuf },
    /// `--schedule throughput` with a manual pruning rule.
    #[error("--schedule throughput chooses the window itself; drop --min-conf / --calibrated")]
    ThroughputWithManualPruning,
    /// `--schedule throughput` without a calibration or a profile (each entry says which).
    #[error("--schedule throughput: {}", missing.join("; "))]
    ThroughputUnavailable { missing: Vec<String> },
    /// The engine's worker is gone (it stopped, or failed to start).
    #[error("the engine is not running: {0}")]
    EngineStopped(String),
    /// A request's decoding panicked; the worker caught it and goes on.
    #[error("internal error while decoding: {0}")]
    Panicked(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
