//! Writing Gemma-4 checkpoints in the real on-disk formats: random-weight models for tests and
//! the embedded default, the MLX-community quantized layout, and the HF naming. Every write
//! goes through [`crate::staging::StagedDir`], so an interrupted run never leaves something
//! that looks like a checkpoint.

#[cfg(feature = "testing")]
mod hf_layout;
mod quantize;
mod random;
mod shards;
mod tokenizer;

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

pub use crate::staging::StagedDir;
#[cfg(feature = "testing")]
pub use hf_layout::write_hf_layout;
pub use quantize::quantize_checkpoint;
pub use random::{param_specs, random_weights, write_random_checkpoint, write_weights, Init, ParamSpec};
pub use shards::{write_json, write_shards, ShardWriter};
pub use tokenizer::write_word_level_tokenizer;

/// `lm_head.*` stays at the top level; everything else gets `prefix`.
pub(crate) fn full_name(name: &str, prefix: &str) -> String {
    if name.starts_with("lm_head.") {
        name.to_string()
    } else {
        format!("{prefix}{name}")
    }
}

pub(crate) fn read_config_json(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    serde_json::from_str(&text).map_err(|source| Error::Json { path, source })
}
