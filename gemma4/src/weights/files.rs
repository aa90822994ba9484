//! Reading a checkpoint's tensor files: shard discovery, the `model.safetensors.index.json`
//! weight map, and a check of each shard's safetensors header before MLX reads it.
//!
//! MLX's loader trusts the header: overlapping data ranges or element types the model cannot
//! use (int8, bool, fp8, complex) would load and compute garbage, or fail later without naming
//! the tensor. So each header is checked here, naming the file and tensor.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use mlx_core::Array;
use serde_json::Value;

use crate::error::{Error, Result};

/// The index file name mlx-lm and HF write next to the shards.
pub const INDEX: &str = "model.safetensors.index.json";

/// Element types a Gemma-4 checkpoint may hold: float weights, norms and quantization scales
/// and biases, plus uint32 packed quantized weights.
const ALLOWED_DTYPES: [&str; 4] = ["F32", "F16", "BF16", "U32"];

/// Headers above this size are refused (real ones are well under a megabyte).
const MAX_HEADER: u64 = 100 << 20;

fn is_shard_name(n: &str) -> bool {
    n.starts_with("model") && n.ends_with(".safetensors")
}

/// The `model*.safetensors` shards of a checkpoint directory, in name order. When
/// `model.safetensors.index.json` exists, every shard it names must be a plain file name of
/// such a shard inside the directory, and present.
pub fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    let mut shards: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(is_shard_name))
        .collect();
    shards.sort();
    if let Some(index) = read_index(dir)? {
        for shard in index.values().collect::<BTreeSet<_>>() {
            if !dir.join(shard).is_file() {
                return Err(Error::MissingShard { dir: dir.to_path_buf(), shard: shard.clone() });
            }
        }
    }
    if shards.is_empty() {
        return Err(Error::NoWeights { dir: dir.to_path_buf() });
    }
    Ok(shards)
}

/// The index's weight map (tensor name → shard file name), if the directory has an index.
/// Entries must be strings naming a `model*.safetensors` file directly inside `dir`.
pub fn read_index(dir: &Path) -> Result<Option<BTreeMap<String, String>>> {
    let path = dir.join(INDEX);
    if !path.is_file() {
        return Ok(None);
    }
    let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    let v: Value = serde_json::from_str(&text).map_err(|source| Error::Json { path: path.clone(), source })?;
    let bad = |entry: &str, detail: String| Error::Index { path: path.clone(), entry: entry.to_string(), detail };
    let map = match v.get("weight_map") {
        None => return Ok(Some(BTreeMap::new())),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(bad("weight_map", format!("expected an object, got {other}"))),
    };
    let mut out = BTreeMap::new();
    for (tensor, shard) in map {
        let Some(shard) = shard.as_str() else {
            return Err(bad(tensor, format!("expected a shard file name, got {shard}")));
        };
        let mut parts = Path::new(shard).components();
        let plain = matches!((parts.next(), parts.next()), (Some(Component::Normal(_)), None));
        if !plain {
            return Err(bad(tensor, format!("shard {shard:?} is not a file inside the checkpoint directory")));
        }
        if !is_shard_name(shard) {
            return Err(bad(
                tensor,
                format!("shard {shard:?} is not a model*.safetensors file, which is all that is loaded"),
            ));
        }
        out.insert(tensor.clone(), shard.to_string());
    }
    Ok(Some(out))
}

/// Loads every shard (lazily: MLX reads data at first evaluation), file by file: the shard's
/// file name and its tensors. Headers are checked first; a tensor in two shards, or an index
/// entry naming a tensor its shard lacks, is refused.
pub fn load_raw_files(dir: &Path) -> Result<Vec<(String, BTreeMap<String, Array>)>> {
    let mut files = Vec::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for shard in shard_paths(dir)? {
        let name = shard.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        check_header(&shard)?;
        let file = mlx_core::load_safetensors(&shard)?;
        for k in file.tensors.keys() {
            if let Some(first) = origin.insert(k.clone(), name.clone()) {
                return Err(Error::DuplicateTensor { dir: dir.to_path_buf(), name: k.clone(), first, second: name });
            }
        }
        files.push((name, file.tensors.into_iter().collect()));
    }
    if let Some(index) = read_index(dir)? {
        for (tensor, shard) in index {
            if origin.get(&tensor) != Some(&shard) {
                let detail = format!("tensor is listed in {shard:?}, which does not contain it");
                return Err(Error::Index { path: dir.join(INDEX), entry: tensor, detail });
            }
        }
    }
    Ok(files)
}

/// Loads every shard into one map (lazily: MLX reads data at first evaluation).
pub fn load_raw(dir: &Path) -> Result<BTreeMap<String, Array>> {
    Ok(load_raw_files(dir)?.into_iter().flat_map(|(_, t)| t).collect())
}

/// Checks a safetensors header: element types a checkpoint may hold, data ranges inside the
/// file, of the size dtype × shape says, and not overlapping. A header that does not parse is
/// left to MLX's loader, whose error names the file.
pub fn check_header(path: &Path) -> Result<()> {
    let Some((header, data_len)) = read_header(path)? else { return Ok(()) };
    let bad = |tensor: &str, detail: String| Error::Shard { path: path.to_path_buf(), tensor: tensor.into(), detail };
    let mut ranges: Vec<(u64, u64, &str)> = Vec::new();
    for (name, info) in header.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let expected = "F32, F16 or BF16 (weights, norms, quantization scales) or U32 (packed quantized weights)";
        let dtype = match info.get("dtype") {
            Some(Value::String(d)) => d.as_str(),
            Some(other) => return Err(bad(name, format!("dtype is {other}, expected a name: {expected}"))),
            None => return Err(bad(name, format!("has no dtype, expected one of {expected}"))),
        };
        if !ALLOWED_DTYPES.contains(&dtype) {
            return Err(bad(name, format!("dtype {dtype}, expected {expected}")));
        }
        let offsets = info.get("data_offsets").and_then(Value::as_array);
        let offsets: Option<Vec<u64>> = offsets.map(|o| o.iter().filter_map(Value::as_u64).collect());
        let Some(&[start, end]) = offsets.as_deref() else {
            return Err(bad(name, "data_offsets is not a pair of byte offsets".into()));
        };
        if start > end || end > data_len {
            return Err(bad(name, format!("data_offsets [{start}, {end}] lie outside the {data_len} data bytes")));
        }
        let shape = info.get("shape").and_then(Value::as_array);
        let elems = shape.and_then(|s| s.iter().try_fold(1u64, |acc, d| acc.checked_mul(d.as_u64()?)));
        let width = if dtype == "F16" || dtype == "BF16" { 2 } else { 4 };
        if elems.and_then(|n| n.checked_mul(width)) != Some(end - start) {
            // The header's own text ([256, 32]), not the parser's debug form.
            let shape = info.get("shape").map_or_else(|| "none".to_string(), Value::to_string);
            return Err(bad(name, format!("shape {shape} of {dtype} does not fill data_offsets [{start}, {end}]")));
        }
        if start < end {
            ranges.push((start, end, name));
        }
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((s0, e0, a), (s1, e1, b)) = (pair[0], pair[1]);
        if s1 < e0 {
            return Err(bad(b, format!("data_offsets [{s1}, {e1}] overlap those of tensor {a:?} [{s0}, {e0}]")));
        }
    }
    Ok(())
}

/// The header's JSON object and the length of the data section, or None when the file is too
/// short or the header is not a JSON object.
fn read_header(path: &Path) -> Result<Option<(serde_json::Map<String, Value>, u64)>> {
    let io = |source| Error::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let mut len = [0u8; 8];
    if f.read_exact(&mut len).is_err() {
        return Ok(None);
    }
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER || n > file_len.saturating_sub(8) {
        return Ok(None);
    }
    let mut buf = vec![0u8; n as usize];
    f.read_exact(&mut buf).map_err(io)?;
    match serde_json::from_slice::<Value>(&buf) {
        Ok(Value::Object(map)) => Ok(Some((map, file_len - 8 - n))),
        _ => Ok(None),
    }
}
