//! Errors of drafter-quant. Every refusal names the path (and the tensor, where there is one)
//! and says what to do instead; failures of the crates underneath are kept as sources.

use std::path::PathBuf;

/// Errors from quantizing a drafter checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `--bits` other than 4 or 8.
    #[error("bits {0} is not supported: expected 4 or 8")]
    UnsupportedBits(u32),
    /// `--group-size` other than 32, 64 or 128.
    #[error("group size {0} is not supported: expected 32, 64 or 128")]
    UnsupportedGroupSize(u32),
    /// The source is not a DeepSpec or DSpark checkpoint; `detail` says what was found.
    #[error("{}: not a drafter checkpoint: {detail}", path.display())]
    NotDrafter {
        /// The source directory.
        path: PathBuf,
        /// What was found instead.
        detail: String,
    },
    /// The source is a Gemma-4 target model.
    #[error(
        "{}: this is a Gemma-4 target model (model_type {model_type:?}), not a drafter — quantize targets with \
         `dspark quantize-target --model <dir> --out <dir>` (gemma4::checkpoint::quantize_checkpoint)",
        path.display()
    )]
    TargetModel {
        /// The source directory.
        path: PathBuf,
        /// The config's `model_type`.
        model_type: String,
    },
    /// The source already holds MLX-quantized tensors.
    #[error("{}: source is already quantized ({evidence}) — start from the bf16 checkpoint", path.display())]
    AlreadyQuantized {
        /// The source directory.
        path: PathBuf,
        /// The block or packed tensor that shows it.
        evidence: String,
    },
    /// A parameter the format says is a matrix is not 2-D.
    #[error("{}: tensor {tensor:?} has shape {shape:?}, expected a 2-D matrix", path.display())]
    NotMatrix {
        /// The source file.
        path: PathBuf,
        /// The parameter's name.
        tensor: String,
        /// Its shape.
        shape: Vec<i32>,
    },
    /// The output directory has files and `force` is off.
    #[error("{}: output directory exists and is not empty (replacing it must be forced)", path.display())]
    OutputNotEmpty {
        /// The output directory.
        path: PathBuf,
    },
    /// The output directory is the source directory.
    #[error("output {} would replace the source checkpoint {}", dst.display(), src.display())]
    OutputIsSource {
        /// The source checkpoint.
        src: PathBuf,
        /// The requested output.
        dst: PathBuf,
    },
    /// The written checkpoint did not load or draft (the output is not committed).
    #[error("load smoke of {} failed at {stage}", path.display())]
    Smoke {
        /// The written checkpoint.
        path: PathBuf,
        /// What the smoke was doing (loading, drafting a round, …).
        stage: &'static str,
        /// The error.
        source: Box<spec_decode::Error>,
    },
    /// The written checkpoint drafted, but with the wrong shapes or values.
    #[error("load smoke of {}: {what}", path.display())]
    SmokeCheck {
        /// The written checkpoint.
        path: PathBuf,
        /// The check that failed.
        what: String,
    },
    /// From the drafter crate (config parsing, loading); boxed, it is large.
    #[error(transparent)]
    Drafter(Box<spec_decode::Error>),
    /// From gemma4 (checkpoint files, staging); boxed, it is large.
    #[error(transparent)]
    Checkpoint(Box<gemma4::Error>),
    /// An MLX op failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// Filesystem error with the path it concerns.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A JSON file could not be parsed.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's error, with line and column.
        source: serde_json::Error,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<spec_decode::Error> for Error {
    fn from(e: spec_decode::Error) -> Error {
        Error::Drafter(Box::new(e))
    }
}

impl From<gemma4::Error> for Error {
    fn from(e: gemma4::Error) -> Error {
        Error::Checkpoint(Box::new(e))
    }
}

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_path_buf(), source }
}
