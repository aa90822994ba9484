//! Safetensors shards plus `model.safetensors.index.json`, in mlx-lm's layout.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::Array;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Writes a JSON file.
pub fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|source| Error::Json { path: path.to_path_buf(), source })?;
    std::fs::write(path, text + "\n").map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Writes `tensors` (full names) as `shards` safetensors files plus
/// `model.safetensors.index.json`, the way mlx-lm's `save_model` lays them out.
pub fn write_shards(dir: &Path, tensors: &BTreeMap<String, Array>, shards: usize) -> Result<()> {
    let per = tensors.len().div_ceil(shards.max(1)).max(1);
    let mut writer = ShardWriter::new(dir, usize::MAX);
    let items: Vec<(&String, &Array)> = tensors.iter().collect();
    for chunk in items.chunks(per) {
        writer.push(chunk.iter().map(|(n, a)| ((*n).clone(), (*a).clone())).collect())?;
        writer.cut()?;
    }
    writer.finish().map(|_| ())
}

/// A streaming shard writer: tensors are flushed to a shard once `max_bytes` would be
/// exceeded (or at `cut`), so memory holds at most one shard of output (a 7 GB bf16 drafter
/// never sits in memory whole). The finished directory has mlx-lm's layout:
/// `model.safetensors` or `model-0000i-of-0000N.safetensors`, plus
/// `model.safetensors.index.json`; shard metadata `{"format": "mlx"}`.
pub struct ShardWriter {
    dir: PathBuf,
    max_bytes: usize,
    pending: Vec<(String, Array)>,
    pending_bytes: usize,
    /// Flushed parts: temporary file and the tensor names it holds.
    parts: Vec<(PathBuf, Vec<String>)>,
    total_bytes: usize,
}

impl ShardWriter {
    /// Shards of at most `max_bytes` (a single tensor larger than that gets a shard of its own).
    pub fn new(dir: &Path, max_bytes: usize) -> ShardWriter {
        ShardWriter {
            dir: dir.to_path_buf(),
            max_bytes: max_bytes.max(1),
            pending: Vec::new(),
            pending_bytes: 0,
            parts: Vec::new(),
            total_bytes: 0,
        }
    }

    /// Adds tensors that belong together (one source tensor's outputs), ending the current
    /// shard first if they would not fit in it.
    pub fn push(&mut self, tensors: Vec<(String, Array)>) -> Result<()> {
        let bytes: usize = tensors.iter().map(|(_, a)| a.nbytes()).sum();
        if !self.pending.is_empty() && self.pending_bytes.saturating_add(bytes) > self.max_bytes {
            self.cut()?;
        }
        self.pending_bytes += bytes;
        self.total_bytes += bytes;
        self.pending.extend(tensors);
        Ok(())
    }

    /// Ends the current shard (writes it under a temporary name).
    pub fn cut(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(format!(".part-{}.safetensors", self.parts.len()));
        let meta: BTreeMap<String, String> = [("format".to_string(), "mlx".to_string())].into_iter().collect();
        mlx_core::save_safetensors(&path, self.pending.iter().map(|(n, a)| (n.as_str(), a)), &meta)?;
        let names = self.pending.drain(..).map(|(n, _)| n).collect();
        self.parts.push((path, names));
        self.pending_bytes = 0;
        Ok(())
    }

    /// Writes the last shard, gives the parts their final names and writes the index.
    /// Returns (shard count, total tensor bytes).
    pub fn finish(mut self) -> Result<(usize, usize)> {
        self.cut()?;
        let n = self.parts.len();
        let mut weight_map = serde_json::Map::new();
        for (i, (part, names)) in self.parts.iter().enumerate() {
            let file = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            };
            let dest = self.dir.join(&file);
            std::fs::rename(part, &dest).map_err(|source| Error::Io { path: dest.clone(), source })?;
            for name in names {
                weight_map.insert(name.clone(), Value::String(file.clone()));
            }
        }
        let index = json!({"metadata": {"total_size": self.total_bytes}, "weight_map": Value::Object(weight_map)});
        write_json(&self.dir.join("model.safetensors.index.json"), &index)?;
        Ok((n, self.total_bytes))
    }
}
