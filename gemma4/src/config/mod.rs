//! Gemma-4 `config.json` → validated [`TextConfig`].
//!
//! Two stages: [`RawTextConfig`] mirrors the JSON (every field optional), and
//! `TextConfig::try_from(raw)` resolves the layout, applies mlx-lm's defaults, validates, and
//! derives the per-layer facts once, so model code never re-reads strings or re-derives donors.
//!
//! Absent fields take mlx-lm's `gemma4_text.ModelArgs` defaults, which are **E2B's**:
//! a missing field silently means an E2B value. That is why [`TextConfig::to_json_value`]
//! writes every field explicitly.

mod error;
mod fixtures;
mod layer_spec;
mod quant;
mod raw;
mod validate;

#[cfg(test)]
mod tests;

use std::path::Path;

use serde_json::{json, Map, Value};

pub use error::ConfigError;
pub use fixtures::{tiny_config_a, tiny_config_b, tiny_config_moe_top8, tiny_dense_config};
pub use layer_spec::{KvSource, LayerKind, LayerSpec, Layout, RopeSpec, RopeType};
pub use quant::{QuantSpec, QuantizationConfig};
pub use raw::{RawRope, RawTextConfig};

use raw::token_ids;

/// The validated, typed decoder config. Model code reads only this.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    /// Where the decoder's fields and weights live (flat or under `text_config`).
    pub layout: Layout,
    /// Residual-stream width `H`.
    pub hidden_size: usize,
    /// Decoder layers, donors and KV-shared ones together.
    pub num_hidden_layers: usize,
    /// Dense MLP inner width (doubled on shared layers under `use_double_wide_mlp`).
    pub intermediate_size: usize,
    /// Query heads per layer.
    pub num_attention_heads: usize,
    /// KV heads of sliding layers, and of full layers unless k_eq_v applies.
    pub num_key_value_heads: usize,
    /// KV heads of full layers, only when `attention_k_eq_v` (ignored otherwise, as in mlx-lm).
    pub num_global_key_value_heads: Option<usize>,
    /// Head dim of sliding layers.
    pub head_dim: usize,
    /// Head dim of full-attention layers.
    pub global_head_dim: usize,
    /// Full layers use one projection for K and V (V is the raw k_proj output).
    pub attention_k_eq_v: bool,
    /// Trailing layers that reuse a donor's K/V instead of their own cache.
    pub num_kv_shared_layers: usize,
    /// `num_hidden_layers − num_kv_shared_layers`: the number of donor layers and caches.
    pub first_kv_shared: usize,
    /// PLE width; 0 means PLE off.
    pub hidden_size_per_layer_input: usize,
    /// Vocabulary size `V` of the embedding and LM head.
    pub vocab_size: usize,
    /// Rows of the per-layer-input (PLE) embedding table.
    pub vocab_size_per_layer_input: usize,
    /// KV-shared layers get an MLP of `2 × intermediate_size`.
    pub use_double_wide_mlp: bool,
    /// Tanh softcap on the final logits (`cap · tanh(x / cap)`); `None` when disabled.
    pub final_logit_softcapping: Option<f32>,
    /// Sliding-attention window, in tokens.
    pub sliding_window: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f32,
    /// False means the checkpoint has an `lm_head`.
    pub tie_word_embeddings: bool,
    /// Layers carry a mixture-of-experts block next to the dense MLP.
    pub enable_moe_block: bool,
    /// Experts per MoE block, when `enable_moe_block`.
    pub num_experts: Option<usize>,
    /// Experts routed per token, when `enable_moe_block`.
    pub top_k_experts: Option<usize>,
    /// Inner width of each expert, when `enable_moe_block`.
    pub moe_intermediate_size: Option<usize>,
    /// Numerically irrelevant for default/proportional RoPE; `generate` refuses to run past it.
    pub max_position_embeddings: usize,
    /// Stop ids: top-level `eos_token_id`, overridden by generation_config.json in `from_dir`.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token id.
    pub bos_token_id: u32,
    /// Padding token id.
    pub pad_token_id: u32,
    /// Per-layer facts, one entry per decoder layer.
    pub layers: Vec<LayerSpec>,
    /// The MLX `quantization` block when the checkpoint is quantized.
    pub quantization: Option<QuantizationConfig>,
}

/// An f32 as the JSON number of its shortest decimal form (1e-6, not 9.99999997e-7).
fn f32_json(x: f32) -> Value {
    Value::from(x.to_string().parse::<f64>().unwrap_or(f64::from(x)))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    let io = |source| ConfigError::Io { path: path.to_path_buf(), source };
    mlx_core::files::read_text(path, mlx_core::files::JSON_LIMIT).map_err(io)
}

/// Reads generation_config.json's `eos_token_id` the way mlx-lm's `load_config` does: an
/// undecodable file is ignored, and the falsy `0`, `null` and `[]` do not override. `false`
/// (not a token id) is refused.
fn generation_eos(path: &Path) -> Result<Option<Vec<u32>>, ConfigError> {
    if !path.exists() {
        return Ok(None);
    }
    let value = serde_json::from_str::<Value>(&read(path)?).unwrap_or(Value::Null);
    let eos = match value.get("eos_token_id") {
        None => return Ok(None),
        Some(Value::Number(n)) if n.as_u64() == Some(0) => return Ok(None),
        Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(v) => v,
    };
    let field = "eos_token_id".to_string();
    match eos {
        Value::Bool(false) => Err(error::invalid(field, "one or more token ids", "false").in_file(path)),
        v => token_ids(v).map_err(|source| ConfigError::Type { field, source }.in_file(path)),
    }
}

impl TextConfig {
    /// Parses and validates `config.json` text (either layout).
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        TextConfig::try_from(RawTextConfig::from_json_str(s)?)
    }

    /// Reads `dir/config.json`; `dir/generation_config.json`'s `eos_token_id` replaces the
    /// stop ids, as mlx-lm's `load_config` does. Errors name the file.
    pub fn from_dir(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join("config.json");
        let text = read(&path)?;
        let mut cfg = Self::from_json_str(&text).map_err(|e| e.in_file(&path))?;
        let gen_path = dir.join("generation_config.json");
        if let Some(ids) = generation_eos(&gen_path)? {
            let checked = validate::check_eos(&ids, cfg.vocab_size);
            cfg.eos_token_ids = checked.map_err(|e| e.in_field("eos_token_id").in_file(&gen_path))?;
        }
        Ok(cfg)
    }

    /// Layer `i`. Panics if `i >= num_hidden_layers`, like slice indexing.
    pub fn layer(&self, i: usize) -> &LayerSpec {
        &self.layers[i]
    }

    /// One cache per donor layer.
    pub fn num_caches(&self) -> usize {
        self.first_kv_shared
    }

    /// Whether per-layer inputs (PLE) are on (`hidden_size_per_layer_input > 0`).
    pub fn has_ple(&self) -> bool {
        self.hidden_size_per_layer_input > 0
    }

    /// A complete flat `gemma4_text` config.json with every field explicit, so no
    /// E2B default can leak in. Re-parsing gives an equal config except `layout`, which is Flat.
    pub fn to_json_value(&self) -> Value {
        let mut rope = Map::new();
        for l in &self.layers {
            rope.entry(l.kind.as_str()).or_insert_with(|| {
                json!({
                    "rope_type": l.rope.rope_type.as_str(),
                    "rope_theta": f32_json(l.rope.theta),
                    "partial_rotary_factor": f32_json(l.rope.partial_rotary_factor),
                    "factor": f32_json(l.rope.factor),
                })
            });
        }
        let mut v = json!({
            "model_type": "gemma4_text",
            "hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_global_key_value_heads": self.num_global_key_value_heads,
            "head_dim": self.head_dim, "global_head_dim": self.global_head_dim,
            "attention_k_eq_v": self.attention_k_eq_v,
            "num_kv_shared_layers": self.num_kv_shared_layers,
            "hidden_size_per_layer_input": self.hidden_size_per_layer_input,
            "vocab_size": self.vocab_size,
            "vocab_size_per_layer_input": self.vocab_size_per_layer_input,
            "use_double_wide_mlp": self.use_double_wide_mlp,
            "final_logit_softcapping": self.final_logit_softcapping.map(f32_json),
            "sliding_window": self.sliding_window,
            "layer_types": self.layers.iter().map(|l| l.kind.as_str()).collect::<Vec<_>>(),
            "rope_parameters": rope, "rms_norm_eps": f32_json(self.rms_norm_eps),
            "tie_word_embeddings": self.tie_word_embeddings,
            "enable_moe_block": self.enable_moe_block, "num_experts": self.num_experts,
            "top_k_experts": self.top_k_experts,
            "moe_intermediate_size": self.moe_intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "eos_token_id": self.eos_token_ids, "bos_token_id": self.bos_token_id,
            "pad_token_id": self.pad_token_id,
        });
        if let (Value::Object(map), Some(q)) = (&mut v, &self.quantization) {
            map.insert("quantization".into(), q.to_json_value());
        }
        v
    }
}
