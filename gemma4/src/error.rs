//! Errors of the gemma4 crate. Weight errors name the tensor (and the checkpoint directory);
//! config errors come from `config::ConfigError` and name the file and field.

use std::path::PathBuf;

/// Errors from loading or running a Gemma-4 model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    #[error("{}: no model*.safetensors files found", dir.display())]
    NoWeights { dir: PathBuf },
    #[error("{}: the index lists shard {shard:?}, which does not exist", dir.display())]
    MissingShard { dir: PathBuf, shard: String },
    #[error("{}: tensor {name:?} appears in both {first} and {second}", dir.display())]
    DuplicateTensor { dir: PathBuf, name: String, first: String, second: String },
    #[error("{}: missing tensor {name:?}", dir.display())]
    MissingWeight { dir: PathBuf, name: String },
    #[error("{}: tensor {name:?} has shape {got:?}, expected {expected:?}", dir.display())]
    WeightShape { dir: PathBuf, name: String, expected: Vec<i32>, got: Vec<i32> },
    /// `dir` is the shard file when known.
    #[error("{}: tensor {name:?} has dtype {got}, expected {expected}", dir.display())]
    WeightDtype { dir: PathBuf, name: String, expected: String, got: String },
    #[error("{}: {count} tensors are not used by the model (first: {first:?}); the checkpoint does not match its config", dir.display())]
    UnusedWeights { dir: PathBuf, count: usize, first: Vec<String> },
    #[error("{}: quantized tensor {name:?}: {detail}", dir.display())]
    Quantization { dir: PathBuf, name: String, detail: String },
    /// A bad `model.safetensors.index.json` entry (`entry` is the tensor name, or the key).
    #[error("{}: weight_map entry {entry:?}: {detail}", path.display())]
    Index { path: PathBuf, entry: String, detail: String },
    /// A bad tensor record in a safetensors header.
    #[error("{}: tensor {tensor:?}: {detail}", path.display())]
    Shard { path: PathBuf, tensor: String, detail: String },
    #[error("{}: this is a drafter checkpoint, not a target ({reason})", dir.display())]
    NotATarget { dir: PathBuf, reason: String },
    #[error("{feature} is not implemented: {detail}")]
    Unsupported { feature: &'static str, detail: String },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("cache: {0}")]
    Cache(#[from] crate::cache::CacheError),
    #[error("{op}: {detail}")]
    Input { op: &'static str, detail: String },
    /// A loaded checkpoint computed non-finite values.
    #[error("{}: {detail}", dir.display())]
    NonFinite { dir: PathBuf, detail: String },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
