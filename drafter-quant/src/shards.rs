//! A streaming shard writer: tensors are evaluated as they arrive and flushed to a shard once
//! `max_bytes` would be exceeded, so memory holds at most one shard of output (a 7 GB bf16
//! drafter never sits in memory whole). The finished directory has mlx-lm's layout:
//! `model.safetensors` or `model-0000i-of-0000N.safetensors`, plus
//! `model.safetensors.index.json`; shard metadata `{"format": "mlx"}`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::Array;
use serde_json::{json, Map, Value};

use crate::error::{io, Result};

pub(crate) struct ShardWriter {
    dir: PathBuf,
    max_bytes: usize,
    pending: Vec<(String, Array)>,
    pending_bytes: usize,
    /// Flushed parts: temporary file and the tensor names it holds.
    parts: Vec<(PathBuf, Vec<String>)>,
    total_bytes: usize,
}

impl ShardWriter {
    pub(crate) fn new(dir: &Path, max_bytes: usize) -> ShardWriter {
        ShardWriter { dir: dir.to_path_buf(), max_bytes: max_bytes.max(1), pending: Vec::new(), pending_bytes: 0, parts: Vec::new(), total_bytes: 0 }
    }

    /// Adds evaluated tensors (one source tensor's outputs), flushing first if they would not
    /// fit in the current shard.
    pub(crate) fn push(&mut self, tensors: Vec<(String, Array)>) -> Result<()> {
        let bytes: usize = tensors.iter().map(|(_, a)| a.nbytes()).sum();
        if !self.pending.is_empty() && self.pending_bytes + bytes > self.max_bytes {
            self.flush()?;
        }
        self.pending_bytes += bytes;
        self.total_bytes += bytes;
        self.pending.extend(tensors);
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
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
    pub(crate) fn finish(mut self) -> Result<(usize, usize)> {
        self.flush()?;
        let n = self.parts.len();
        let mut weight_map = Map::new();
        for (i, (part, names)) in self.parts.iter().enumerate() {
            let file = if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) };
            let dest = self.dir.join(&file);
            std::fs::rename(part, &dest).map_err(io(&dest))?;
            for name in names {
                weight_map.insert(name.clone(), Value::String(file.clone()));
            }
        }
        let index = json!({"metadata": {"total_size": self.total_bytes}, "weight_map": Value::Object(weight_map)});
        gemma4::checkpoint::write_json(&self.dir.join("model.safetensors.index.json"), &index)?;
        Ok((n, self.total_bytes))
    }
}
