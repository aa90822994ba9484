//! Re-expressing a flat checkpoint in Hugging Face naming.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::{concatenate, Array, Dtype};
use serde_json::json;

use super::shards::{write_json, write_shards};
use super::tokenizer::copy_tokenizer;
use crate::config::TextConfig;
use crate::error::{Error, Result};
use crate::staging::StagedDir;

/// Re-expresses a flat bf16 checkpoint in HF naming (`model.language_model.*`, nested
/// `text_config`, fused `experts.gate_up_proj`) with the junk tensors real HF checkpoints carry
/// (a vision tower entry, rotary buffers, stray k/v on KV-shared layers), which sanitize drops.
pub fn write_hf_layout(src: &Path, dest: &Path, force: bool) -> Result<PathBuf> {
    let cfg = TextConfig::from_dir(src)?;
    let (tensors, _) = crate::weights::sanitize(crate::weights::load_raw(src)?, &cfg)?;
    let mut out = BTreeMap::new();
    let lm = "model.language_model.";
    let mut pending_gate: BTreeMap<String, Array> = BTreeMap::new();
    for (name, w) in tensors {
        if let Some(base) = name.strip_suffix(".experts.switch_glu.gate_proj.weight") {
            pending_gate.insert(base.to_string(), w);
        } else if let Some(base) = name.strip_suffix(".experts.switch_glu.up_proj.weight") {
            let gate = pending_gate.remove(base).ok_or_else(|| Error::MissingWeight {
                dir: src.to_path_buf(),
                name: format!("{base}.experts.switch_glu.gate_proj.weight"),
            })?;
            out.insert(format!("{lm}{base}.experts.gate_up_proj"), concatenate(&[&gate, &w], -2)?);
        } else if let Some(base) = name.strip_suffix(".experts.switch_glu.down_proj.weight") {
            out.insert(format!("{lm}{base}.experts.down_proj"), w);
        } else if name.starts_with("lm_head.") {
            out.insert(format!("model.language_model.{name}"), w);
        } else {
            out.insert(format!("{lm}{name}"), w);
        }
    }
    let dtype = out.values().next().map(|a| a.dtype()).unwrap_or(Dtype::Bf16);
    out.insert("model.vision_tower.patch_embed.weight".into(), Array::zeros(&[4, 4], dtype)?);
    out.insert(format!("{lm}layers.0.self_attn.rotary_emb.inv_freq"), Array::zeros(&[4], Dtype::F32)?);
    if let Some(shared) = (cfg.first_kv_shared..cfg.num_hidden_layers).next() {
        let l = &cfg.layers[shared];
        let shape = [(l.n_kv_heads * l.head_dim) as i32, cfg.hidden_size as i32];
        out.insert(format!("{lm}layers.{shared}.self_attn.k_proj.weight"), Array::zeros(&shape, dtype)?);
    }
    let staged = StagedDir::new(dest, force)?;
    write_shards(staged.path(), &out, 2)?;
    let text = cfg.to_json_value();
    let nested = json!({
        "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text, "vocab_size": cfg.vocab_size, "eos_token_id": cfg.eos_token_ids,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    });
    write_json(&staged.path().join("config.json"), &nested)?;
    copy_tokenizer(src, staged.path())?;
    staged.commit()
}
