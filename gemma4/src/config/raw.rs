//! `config.json` as written: every field optional, both layouts, field-naming type errors.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::error::ConfigError;

/// One `rope_parameters` entry as written. Floats are f64 so `int(dims * factor)` matches
/// Python's double arithmetic.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RawRope {
    /// `"default"` or `"proportional"`.
    pub rope_type: Option<String>,
    /// Legacy spelling; mlx-lm prefers it over `rope_type` when non-empty.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// Base frequency θ.
    pub rope_theta: Option<f64>,
    /// Fraction of the head dim that rotates.
    pub partial_rotary_factor: Option<f64>,
    /// Frequency scaling factor.
    pub factor: Option<f64>,
}

/// `config.json` as written, for both layouts: the nested decoder is `text_config`.
/// `Some(None)` on the double options means an explicit `null`, which differs from absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RawTextConfig {
    /// `"gemma4_text"` (flat layout) or `"gemma4"` / `"gemma4_unified"` (nested).
    pub model_type: Option<String>,
    /// The decoder's fields in the nested layout.
    pub text_config: Option<Box<RawTextConfig>>,
    /// Residual-stream width `H`.
    pub hidden_size: Option<usize>,
    /// Decoder layers.
    pub num_hidden_layers: Option<usize>,
    /// Dense MLP inner width.
    pub intermediate_size: Option<usize>,
    /// Query heads per layer.
    pub num_attention_heads: Option<usize>,
    /// KV heads of sliding layers (and of full ones unless `attention_k_eq_v`).
    pub num_key_value_heads: Option<usize>,
    /// KV heads of full layers under `attention_k_eq_v`.
    pub num_global_key_value_heads: Option<usize>,
    /// Head dim of sliding layers.
    pub head_dim: Option<usize>,
    /// `null` falls back to `head_dim`, as mlx-lm's truthiness test does.
    #[serde(deserialize_with = "present")]
    pub global_head_dim: Option<Option<usize>>,
    /// Full layers share one projection for K and V.
    pub attention_k_eq_v: Option<bool>,
    /// Trailing layers that reuse a donor's K/V.
    pub num_kv_shared_layers: Option<usize>,
    /// `null` disables PLE, like 0.
    #[serde(deserialize_with = "present")]
    pub hidden_size_per_layer_input: Option<Option<usize>>,
    /// Vocabulary size `V`.
    pub vocab_size: Option<usize>,
    /// Rows of the per-layer-input (PLE) embedding table.
    pub vocab_size_per_layer_input: Option<usize>,
    /// KV-shared layers get a doubled MLP.
    pub use_double_wide_mlp: Option<bool>,
    /// `null` disables the softcap.
    #[serde(deserialize_with = "present")]
    pub final_logit_softcapping: Option<Option<f64>>,
    /// Sliding-attention window, in tokens.
    pub sliding_window: Option<usize>,
    /// Every n-th layer is full attention, when `layer_types` is absent.
    pub sliding_window_pattern: Option<usize>,
    /// Older spelling of `sliding_window_pattern`.
    #[serde(rename = "_sliding_window_pattern")]
    pub sliding_window_pattern_alias: Option<usize>,
    /// Per-layer `"sliding_attention"` / `"full_attention"`.
    pub layer_types: Option<Vec<String>>,
    /// RoPE settings keyed by layer type.
    pub rope_parameters: Option<BTreeMap<String, RawRope>>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: Option<f64>,
    /// The LM head reuses the embedding table.
    pub tie_word_embeddings: Option<bool>,
    /// Layers carry a mixture-of-experts block.
    pub enable_moe_block: Option<bool>,
    /// Experts per MoE block.
    pub num_experts: Option<usize>,
    /// Experts routed per token.
    pub top_k_experts: Option<usize>,
    /// Inner width of each expert.
    pub moe_intermediate_size: Option<usize>,
    /// Context length the model was trained for.
    pub max_position_embeddings: Option<usize>,
    /// Stop ids (an int or a list in the file).
    #[serde(deserialize_with = "token_ids")]
    pub eos_token_id: Option<Vec<u32>>,
    /// Beginning-of-sequence token id.
    pub bos_token_id: Option<u32>,
    /// Padding token id.
    pub pad_token_id: Option<u32>,
    /// MLX `quantization` block, kept as JSON until validation.
    pub quantization: Option<Value>,
    /// HF-style spelling of the quantization block; read when `quantization` is absent.
    pub quantization_config: Option<Value>,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `eos_token_id` is an int or a list of ints. An explicit `null` becomes an empty list: the
/// config names no stop ids, and the tokenizer's eos token applies.
pub(crate) fn token_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u32>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Ids {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(Some(match Option::<Ids>::deserialize(d)? {
        None => Vec::new(),
        Some(Ids::One(id)) => vec![id],
        Some(Ids::Many(ids)) => ids,
    }))
}

impl RawTextConfig {
    /// Parses `config.json` text. Type errors name the offending field, found by
    /// re-deserializing one key at a time (serde_json itself only gives line/column).
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        if let Ok(v) = serde_json::from_str::<Value>(s) {
            if !v.is_object() {
                let got = match v {
                    Value::Array(_) => "an array",
                    Value::String(_) => "a string",
                    Value::Number(_) => "a number",
                    Value::Bool(_) => "a bool",
                    _ => "null",
                };
                return Err(super::error::invalid("config", "a JSON object", got));
            }
        }
        let source = match serde_json::from_str::<RawTextConfig>(s) {
            Ok(raw) => return Ok(raw),
            Err(e) if e.is_syntax() || e.is_eof() => return Err(ConfigError::Json { source: e }),
            Err(e) => e,
        };
        let field = serde_json::from_str::<Value>(s).ok().and_then(|v| locate_bad_field(&v));
        let field = field.unwrap_or_else(|| "config".into());
        Err(ConfigError::Type { field, source })
    }
}

fn locate_bad_field(v: &Value) -> Option<String> {
    let map = v.as_object()?;
    map.iter().find_map(|(key, value)| {
        let single = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
        RawTextConfig::deserialize(&single).err()?;
        let inner = (key == "text_config").then(|| locate_bad_field(value)).flatten();
        Some(inner.map_or_else(|| key.clone(), |f| format!("text_config.{f}")))
    })
}
