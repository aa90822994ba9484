//! Errors of drafter-quant. Every refusal names the path (and the tensor, where there is one)
//! and says what to do instead; failures of the crates underneath are kept as sources.

use std::path::PathBuf;

/// Errors from quantizing a drafter checkpoint.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("bits {0} is not supported: expected 4 or 8")]
    UnsupportedBits(u32),
    #[error("group size {0} is not supported: expected 32, 64 or 128")]
    UnsupportedGroupSize(u32),
    /// The source is not a DeepSpec or DSpark checkpoint; `detail` says what was found.
    #[error("{}: not a drafter checkpoint: {detail}", path.display())]
    NotDrafter { path: PathBuf, detail: String },
    /// The source is a Gemma-4 target model.
    #[error(
        "{}: this is a Gemma-4 target model (model_type {model_type:?}), not a drafter — quantize targets with \
         `dspark quantize-target --model <dir> --out <dir>` (gemma4::checkpoint::quantize_checkpoint)",
        path.display()
    )]
    TargetModel { path: PathBuf, model_type: String },
    #[error("{}: source is already quantized ({evidence}) — start from the bf16 checkpoint", path.display())]
    AlreadyQuantized { path: PathBuf, evidence: String },
    /// A parameter the format says is a matrix is not 2-D.
    #[error("{}: tensor {tensor:?} has shape {shape:?}, expected a 2-D matrix", path.display())]
    NotMatrix { path: PathBuf, tensor: String, shape: Vec<i32> },
    #[error("{}: output directory exists and is not empty (replacing it must be forced)", path.display())]
    OutputNotEmpty { path: PathBuf },
    #[error("output {} would replace the source checkpoint {}", dst.display(), src.display())]
    OutputIsSource { src: PathBuf, dst: PathBuf },
    /// The written checkpoint did not load or draft (the output is not committed).
    #[error("load smoke of {} failed at {stage}", path.display())]
    Smoke { path: PathBuf, stage: &'static str, source: Box<spec_decode::Error> },
    /// The written checkpoint drafted, but with the wrong shapes or values.
    #[error("load smoke of {}: {what}", path.display())]
    SmokeCheck { path: PathBuf, what: String },
    /// From the drafter crate (config parsing, loading); boxed, it is large.
    #[error(transparent)]
    Drafter(Box<spec_decode::Error>),
    /// From gemma4 (checkpoint files, staging); boxed, it is large.
    #[error(transparent)]
    Checkpoint(Box<gemma4::Error>),
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
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
