//! Safetensors files through MLX's own loader (lazy: data is read when evaluated) and writer.
//! Writes are atomic ([`crate::files::write_atomic_with`]): an interrupted save never leaves a
//! truncated checkpoint.

use std::collections::BTreeMap;
use std::path::Path;

use crate::array::{Array, List};
use crate::error::{Error, Result};
use crate::sys::ffi;

/// Tensors of one file, by name, plus the header's `__metadata__`.
#[derive(Debug, Default)]
pub struct SafetensorsFile {
    /// Tensors by name, lazily backed by the file.
    pub tensors: BTreeMap<String, Array>,
    /// String pairs from the header's `__metadata__` (empty when absent).
    pub metadata: BTreeMap<String, String>,
}

/// Loads every tensor of a `.safetensors` file.
pub fn load_safetensors(path: &Path) -> Result<SafetensorsFile> {
    let err = |message: String| Error::Safetensors { path: path.to_path_buf(), message };
    if !path.is_file() {
        return Err(err("file not found".into()));
    }
    let p = path.to_str().ok_or_else(|| err("path is not valid UTF-8".into()))?;
    let mut names = Vec::new();
    let mut meta = Vec::new();
    let list = ffi::load_safetensors(p, &mut names, &mut meta).map_err(|e| err(e.what().to_string()))?;
    let arrays = List(list).into_vec("load_safetensors")?;
    if arrays.len() != names.len() {
        return Err(err("loader returned mismatched names and tensors".into()));
    }
    let tensors = names.into_iter().zip(arrays).collect();
    let metadata = meta.chunks_exact(2).map(|kv| (kv[0].clone(), kv[1].clone())).collect();
    Ok(SafetensorsFile { tensors, metadata })
}

/// Writes `tensors` (evaluating them) to `path` atomically.
pub fn save_safetensors<'a>(
    path: &Path,
    tensors: impl IntoIterator<Item = (&'a str, &'a Array)>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let err = |message: String| Error::Safetensors { path: path.to_path_buf(), message };
    let (names, arrays): (Vec<String>, Vec<&Array>) = tensors.into_iter().map(|(n, a)| (n.to_string(), a)).unzip();
    let list = List::new(arrays.iter().copied())?;
    let meta: Vec<String> = metadata.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect();
    let mut failure = None;
    let written = crate::files::write_atomic_with(path, ".safetensors", |tmp| {
        let tmp_str = tmp.to_str().ok_or_else(|| std::io::Error::other("path is not valid UTF-8"))?;
        ffi::save_safetensors(tmp_str, &names, list.raw(), &meta).map_err(|e| {
            failure = Some(e.what().to_string());
            std::io::Error::other(e.what().to_string())
        })
    });
    match (written, failure) {
        (Ok(()), _) => Ok(()),
        (Err(_), Some(message)) => Err(err(message)),
        (Err(source), None) => Err(Error::Io { path: path.to_path_buf(), source }),
    }
}
