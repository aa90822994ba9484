//! mlx-lm's wrapper and text sanitize rules: checkpoint names → text-model-relative names.

use std::collections::BTreeMap;

use mlx_core::Array;

use crate::config::{Layout, TextConfig};
use crate::error::Result;

const DROPPED_PREFIXES: [&str; 6] =
    ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
const DROPPED_PARTS: [&str; 5] = ["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"];

/// Applies mlx-lm's wrapper and text sanitize rules, returning text-model-relative names and
/// the module prefix the checkpoint's quantization block uses.
pub fn sanitize(raw: BTreeMap<String, Array>, cfg: &TextConfig) -> Result<(BTreeMap<String, Array>, &'static str)> {
    let mut out = BTreeMap::new();
    let prefix = match cfg.layout {
        Layout::Flat => "model.",
        Layout::Nested => "language_model.model.",
    };
    for (key, value) in raw {
        // Wrapper rules (nested layout): strip `model.`, drop multimodal towers, and map
        // `language_model.` to `language_model.model.`; mlx-community keys are already there.
        let key = match cfg.layout {
            Layout::Nested => {
                let (stripped, had_model) = match key.strip_prefix("model.") {
                    Some(s) => (s.to_string(), true),
                    None => (key.clone(), false),
                };
                if DROPPED_PREFIXES.iter().any(|p| stripped.starts_with(p)) {
                    continue;
                }
                let full = if had_model {
                    match stripped.strip_prefix("language_model.") {
                        Some(rest) => format!("language_model.model.{rest}"),
                        None => stripped,
                    }
                } else {
                    stripped
                };
                if let Some(rest) = full.strip_prefix("language_model.model.") {
                    rest.to_string()
                } else if let Some(rest) = full.strip_prefix("language_model.") {
                    rest.to_string() // language_model.lm_head.*
                } else {
                    full
                }
            }
            Layout::Flat => match key.strip_prefix("model.") {
                Some(rest) => rest.to_string(),
                None => key.clone(),
            },
        };
        if DROPPED_PARTS.iter().any(|p| key.contains(p)) {
            continue;
        }
        if [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"].iter().any(|p| key.contains(p)) {
            if let Some(layer) = layer_index(&key) {
                if layer >= cfg.first_kv_shared {
                    continue;
                }
            }
        }
        if let Some(base) = key.strip_suffix(".experts.gate_up_proj") {
            // [E, 2I, H] → gate = first half, up = second half along axis -2.
            let two_i = value.dim(-2)?;
            let gate = value.slice_axis(-2, 0, two_i / 2)?.contiguous()?;
            let up = value.slice_axis(-2, two_i / 2, two_i)?.contiguous()?;
            out.insert(format!("{base}.experts.switch_glu.gate_proj.weight"), gate);
            out.insert(format!("{base}.experts.switch_glu.up_proj.weight"), up);
            continue;
        }
        if let Some(base) = key.strip_suffix(".experts.down_proj") {
            out.insert(format!("{base}.experts.switch_glu.down_proj.weight"), value);
            continue;
        }
        out.insert(key, value);
    }
    Ok((out, prefix))
}

fn layer_index(key: &str) -> Option<usize> {
    let rest = key.split("layers.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}
