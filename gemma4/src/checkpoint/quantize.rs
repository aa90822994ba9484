//! `mlx_lm.convert -q` for a loaded flat checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::quant::{quantize, QuantSpec};
use serde_json::{json, Value};

use super::shards::{write_json, write_shards};
use super::tokenizer::copy_tokenizer;
use super::{full_name, read_config_json};
use crate::config::TextConfig;
use crate::error::{Error, Result};
use crate::staging::StagedDir;

/// mlx-lm's Gemma-4 quant predicate: `router.proj` is always 8-bit, group 64.
fn module_spec(module: &str, default: QuantSpec) -> Result<QuantSpec> {
    if module.ends_with("router.proj") {
        Ok(QuantSpec::new(8, 64)?)
    } else {
        Ok(default)
    }
}

/// Quantizes a loaded flat checkpoint the way `mlx_lm.convert -q` does: every linear, embedding
/// and switch-expert weight whose input dim divides the group size; norms, scalars and 1-D
/// tensors stay as they are. Writes the same layout with a `quantization` block.
pub fn quantize_checkpoint(src: &Path, dest: &Path, bits: u32, group_size: u32, force: bool) -> Result<PathBuf> {
    let cfg = TextConfig::from_dir(src)?;
    if cfg.quantization.is_some() {
        return Err(Error::Input { op: "quantize", detail: format!("{} is already quantized", src.display()) });
    }
    let default = QuantSpec::new(bits, group_size)?;
    let (tensors, prefix) = crate::weights::sanitize(crate::weights::load_raw(src)?, &cfg)?;
    let mut out = BTreeMap::new();
    let mut block = serde_json::Map::new();
    block.insert("group_size".into(), json!(group_size));
    block.insert("bits".into(), json!(bits));
    block.insert("mode".into(), json!("affine"));
    for (name, w) in tensors {
        let ndim = w.ndim()?;
        let module = name.strip_suffix(".weight").filter(|_| ndim >= 2);
        let full = |n: &str| full_name(n, prefix);
        match module {
            Some(m) => {
                let spec = module_spec(m, default)?;
                let in_dim = w.dim(-1)? as u32;
                if !in_dim.is_multiple_of(spec.group_size()) {
                    out.insert(full(&name), w);
                    continue;
                }
                if spec != default {
                    block.insert(full(m), json!({"group_size": spec.group_size(), "bits": spec.bits()}));
                }
                let q = quantize(&w, spec)?;
                out.insert(full(&format!("{m}.weight")), q.weight);
                out.insert(full(&format!("{m}.scales")), q.scales);
                out.insert(full(&format!("{m}.biases")), q.biases);
            }
            None => {
                out.insert(full(&name), w);
            }
        }
    }
    let staged = StagedDir::new(dest, force)?;
    write_shards(staged.path(), &out, 1)?;
    let mut config = read_config_json(src)?;
    if let Value::Object(map) = &mut config {
        map.insert("quantization".into(), Value::Object(block.clone()));
        map.insert("quantization_config".into(), Value::Object(block));
    }
    write_json(&staged.path().join("config.json"), &config)?;
    copy_tokenizer(src, staged.path())?;
    staged.commit()
}
