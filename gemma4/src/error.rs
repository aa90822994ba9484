//! Errors of the gemma4 crate. Weight errors name the tensor (and the checkpoint directory);
//! config errors come from `config::ConfigError` and name the file and field.

use std::path::PathBuf;

/// Errors from loading or running a Gemma-4 model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The checkpoint's `config.json` was refused.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// An MLX op failed.
    #[error(transparent)]
    Mlx(#[from] mlx_core::Error),
    /// The directory holds no `model*.safetensors` weights.
    #[error("{}: no model*.safetensors files found", dir.display())]
    NoWeights {
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// The shard index names a file that is not there.
    #[error("{}: the index lists shard {shard:?}, which does not exist", dir.display())]
    MissingShard {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The shard file name from the index.
        shard: String,
    },
    /// Two shards both hold the same tensor.
    #[error("{}: tensor {name:?} appears in both {first} and {second}", dir.display())]
    DuplicateTensor {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor name.
        name: String,
        /// The shard file that holds it first.
        first: String,
        /// The other shard file.
        second: String,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("{}: missing tensor {name:?}", dir.display())]
    MissingWeight {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor name.
        name: String,
    },
    /// A tensor's shape does not match the one the config implies.
    #[error("{}: tensor {name:?} has shape {got:?}, expected {expected:?}", dir.display())]
    WeightShape {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The tensor name.
        name: String,
        /// Shape the config implies.
        expected: Vec<i32>,
        /// Shape in the checkpoint.
        got: Vec<i32>,
    },
    /// `dir` is the shard file when known.
    #[error("{}: tensor {name:?} has dtype {got}, expected {expected}", dir.display())]
    WeightDtype {
        /// The checkpoint directory or shard file.
        dir: PathBuf,
        /// The tensor name.
        name: String,
        /// The dtype(s) accepted.
        expected: String,
        /// The dtype found.
        got: String,
    },
    /// The checkpoint holds tensors the model never reads: it was written for another config.
    #[error("{}: {count} tensors are not used by the model (first: {first:?}); the checkpoint does not match its config", dir.display())]
    UnusedWeights {
        /// The checkpoint directory.
        dir: PathBuf,
        /// How many tensors are unused.
        count: usize,
        /// The first few unused names, for the message.
        first: Vec<String>,
    },
    /// A quantized tensor (packed weight, scales, biases) is inconsistent with its quantization spec.
    #[error("{}: quantized tensor {name:?}: {detail}", dir.display())]
    Quantization {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The module name.
        name: String,
        /// What is inconsistent.
        detail: String,
    },
    /// A bad `model.safetensors.index.json` entry (`entry` is the tensor name, or the key).
    #[error("{}: weight_map entry {entry:?}: {detail}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// The tensor name, or the offending key.
        entry: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A bad tensor record in a safetensors header.
    #[error("{}: tensor {tensor:?}: {detail}", path.display())]
    Shard {
        /// The shard file.
        path: PathBuf,
        /// The tensor name.
        tensor: String,
        /// What is wrong with the record.
        detail: String,
    },
    /// The directory holds a drafter checkpoint, where a target was expected.
    #[error("{}: this is a drafter checkpoint, not a target ({reason})", dir.display())]
    NotATarget {
        /// The checkpoint directory.
        dir: PathBuf,
        /// What marked it as a drafter.
        reason: String,
    },
    /// A config feature this crate does not implement.
    #[error("{feature} is not implemented: {detail}")]
    Unsupported {
        /// The feature's name.
        feature: &'static str,
        /// Where it was met and why it is refused.
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
    /// A JSON file other than `config.json` could not be parsed.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's error, with line and column.
        source: serde_json::Error,
    },
    /// A cache refused a rollback.
    #[error("cache: {0}")]
    Cache(#[from] crate::cache::CacheError),
    /// A caller passed arguments the model cannot run (wrong shape, bad token id, …), or a tokenizer
    /// call failed.
    #[error("{op}: {detail}")]
    Input {
        /// The function that refused them.
        op: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A loaded checkpoint computed non-finite values.
    #[error("{}: {detail}", dir.display())]
    NonFinite {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Where the non-finite values appeared.
        detail: String,
    },
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;
