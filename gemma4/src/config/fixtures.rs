//! Tiny reference configs: the test suites' fixtures, and the shapes drafter-quant's load smoke
//! builds a target from. Pure config builders (no weights, no files), so they are not behind
//! the `testing` feature, which holds what only tests use (scratch directories, the HF-layout
//! writer).

use serde_json::{json, Value};

use super::{ConfigError, TextConfig};

/// Fixture config A ("E-style") as flat JSON: PLE, KV sharing of both kinds, double-wide MLP,
/// partial RoPE, window 8, GQA 2, softcap.
pub(crate) fn tiny_config_a_json() -> Value {
    let (s, f) = ("sliding_attention", "full_attention");
    json!({
        "model_type": "gemma4_text", "hidden_size": 128, "num_hidden_layers": 6,
        "layer_types": [s, s, f, s, s, f], "num_kv_shared_layers": 3,
        "intermediate_size": 128, "use_double_wide_mlp": true,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "global_head_dim": 64,
        "num_global_key_value_heads": null, "attention_k_eq_v": false,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention":
                {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
        "sliding_window": 8, "hidden_size_per_layer_input": 64,
        "vocab_size": 512, "vocab_size_per_layer_input": 512, "final_logit_softcapping": 30.0,
        "enable_moe_block": false, "tie_word_embeddings": true, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 4096, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    })
}

/// Fixture config B ("26B/31B-style"): A with MoE and k_eq_v full layers, no PLE or sharing.
pub(crate) fn tiny_config_b_json() -> Value {
    let (s, f) = ("sliding_attention", "full_attention");
    let mut v = tiny_config_a_json();
    if let (Value::Object(map), Value::Object(b)) = (
        &mut v,
        json!({
            "num_hidden_layers": 4, "layer_types": [s, f, s, f], "num_kv_shared_layers": 0,
            "use_double_wide_mlp": false, "num_global_key_value_heads": 1, "attention_k_eq_v": true,
            "hidden_size_per_layer_input": 0, "enable_moe_block": true, "num_experts": 4,
            "top_k_experts": 2, "moe_intermediate_size": 64,
        }),
    ) {
        map.extend(b);
    }
    v
}

/// Config B with 16 experts and top-8 routing: 8 rows of a verify window give 64 (token, expert)
/// pairs, where MLX's expert kernels switch to their sorted path. Stepwise forwards must still
/// match one-token decoding bit for bit here.
pub(crate) fn tiny_config_moe_top8_json() -> Value {
    let mut v = tiny_config_b_json();
    if let Value::Object(map) = &mut v {
        map.insert("num_experts".into(), json!(16));
        map.insert("top_k_experts".into(), json!(8));
    }
    v
}

/// Fixture config A, parsed through validation. The JSON is a constant, so failure is a bug here.
pub fn tiny_config_a() -> TextConfig {
    TextConfig::from_json_str(&tiny_config_a_json().to_string()).expect("tiny config A is valid")
}

/// Fixture config B, parsed through validation.
pub fn tiny_config_b() -> TextConfig {
    TextConfig::from_json_str(&tiny_config_b_json().to_string()).expect("tiny config B is valid")
}

/// The MoE top-8 config (see `tiny_config_moe_top8_json`), parsed through validation.
pub fn tiny_config_moe_top8() -> TextConfig {
    TextConfig::from_json_str(&tiny_config_moe_top8_json().to_string()).expect("tiny MoE top-8 config is valid")
}

/// A small dense target shaped by the caller: config A's attention and MLP dims with the given
/// hidden size, vocabulary and depth (sliding layers, the last one full), no PLE, KV sharing or
/// MoE. For tests and smokes that need a target of particular dims, not config A's features.
pub fn tiny_dense_config(hidden_size: usize, vocab_size: usize, num_layers: usize) -> Result<TextConfig, ConfigError> {
    let mut v = tiny_config_a_json();
    let n = num_layers.max(1);
    let types: Vec<&str> = (0..n).map(|i| if i + 1 == n { "full_attention" } else { "sliding_attention" }).collect();
    if let (Value::Object(map), Value::Object(d)) = (
        &mut v,
        json!({
            "hidden_size": hidden_size, "vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size,
            "num_hidden_layers": n, "layer_types": types, "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0,
        }),
    ) {
        map.extend(d);
    }
    TextConfig::from_json_str(&v.to_string())
}
