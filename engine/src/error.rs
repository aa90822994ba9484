//! Errors of the sessions, the engine and the choices the front ends share. The HTTP server
//! validates requests with its own type, which is what a client sees.

use std::path::PathBuf;

/// What can fail while loading or decoding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An MLX operation failed (array op, evaluation, device or stream setup).
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The Gemma-4 target failed: its config or weights, a forward pass, or a prompt plus
    /// `max_tokens` that overflows its positions.
    #[error(transparent)]
    Model(#[from] gemma4::Error),
    /// Speculative decoding failed: loading or running the drafter, or a draft/verify round.
    #[error(transparent)]
    Decode(#[from] spec_decode::Error),
    /// The tokenizer could not be loaded, or could not encode a prompt or decode output ids.
    #[error(transparent)]
    Tokenizer(#[from] gemma4::tokenizer::TokenizerError),
    /// The tokenizer's chat template could not be parsed or could not render a conversation.
    #[error(transparent)]
    Template(#[from] gemma4::chat_template::ChatTemplateError),
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file that could not be read or written.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A checkpoint (model or drafter) could not be loaded.
    #[error("loading {}: {detail}", path.display())]
    Load {
        /// The checkpoint directory.
        path: PathBuf,
        /// What was wrong with it (missing file, bad config, shape mismatch), for the user.
        detail: String,
    },
    /// Settings that cannot work together (`what` names the setting).
    #[error("{what}: {detail}")]
    Settings {
        /// The setting at fault, as the user spells it (`max_concurrency`, `stop`, a flag).
        what: &'static str,
        /// Why its value cannot work.
        detail: String,
    },
    /// `--device` names a backend this MLX build lacks.
    #[error("--device {device:?}: this MLX build has no such backend (MLX at {})", mlx_core::MLX_DIR)]
    NoBackend {
        /// The device that was asked for.
        device: mlx_core::Device,
    },
    /// A drafter checkpoint where a target is expected (`flag` names the option).
    #[error(
        "{flag} {}: this is a {kind:?} drafter checkpoint, not a Gemma-4 target; pass it as --drafter (and a \
         target as {flag})",
        dir.display()
    )]
    DrafterAsModel {
        /// The option that named the directory (`--model`).
        flag: &'static str,
        /// The drafter checkpoint directory passed as a target.
        dir: PathBuf,
        /// The kind of drafter found there.
        kind: spec_decode::DrafterKind,
    },
    /// `--drafter default` with a model other than the embedded default.
    #[error(
        "--drafter default belongs to the embedded default model; pass a drafter directory for --model {}",
        model.display()
    )]
    DefaultDrafterForModel {
        /// The `--model` directory, which is not the embedded default.
        model: PathBuf,
    },
    /// `--schedule throughput` with a manual pruning rule.
    #[error("--schedule throughput chooses the window itself; drop --min-conf / --calibrated")]
    ThroughputWithManualPruning,
    /// `--schedule throughput` without a calibration or a profile (each entry says which).
    #[error("--schedule throughput: {}", missing.join("; "))]
    ThroughputUnavailable {
        /// One line per missing input: the drafter's STS temperatures for this mode (greedy
        /// or sampled; `dspark calibrate`), or the target's verify-cost profile for this
        /// device and dtype (`dspark profile`).
        missing: Vec<String>,
    },
    /// The engine's worker is gone (it stopped, or failed to start).
    #[error("the engine is not running: {0}")]
    EngineStopped(String),
    /// A request's decoding panicked; the worker caught it and goes on.
    #[error("internal error while decoding: {0}")]
    Panicked(String),

    /// A batched step failed for every session whose rows it held.
    #[error("the batched forward failed: {0}")]
    Batch(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
