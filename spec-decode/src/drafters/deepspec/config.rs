//! `config.json` of a DeepSpec checkpoint (DeepSeek `Gemma4DSparkModel`), with the keys,
//! defaults and refusals of DeepSeek's reference reader (listed in docs/formats.md, "DeepSpec
//! drafters"). Every error names `config.json` (the path) and the key. Each refusal guards a variant that would load cleanly and compute the
//! wrong math: `attention_k_eq_v = false` (needs a real v_proj), a non-vanilla Markov head
//! (gated/rnn ship the same tensors) and an activation other than `gelu_pytorch_tanh`.

use std::path::{Path, PathBuf};

use gemma4::config::{ConfigError, QuantizationConfig};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The `architectures[0]` of a DeepSpec checkpoint (also the serve-time detection key).
pub const ARCHITECTURE: &str = "Gemma4DSparkModel";

/// How the backbone rotates q and k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeKind {
    /// `rotated_dims = floor(head_dim · partial_rotary_factor)` dims rotate with wavelengths
    /// θ^(2k/head_dim) (full head_dim divisor); the rest are the identity.
    Proportional {
        /// Fraction of `head_dim` that rotates.
        partial_rotary_factor: f64,
    },
    /// Plain RoPE over the whole head.
    Default,
}

/// The parsed, validated DeepSpec config.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpecConfig {
    /// Drafter width; equals the target's `hidden_size`.
    pub hidden_size: usize,
    /// Drafter layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// `global_head_dim`.
    pub head_dim: usize,
    /// `num_global_key_value_heads` (K ≡ V).
    pub num_kv_heads: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Tanh softcap on the draft logits; `None` when disabled.
    pub final_logit_softcapping: Option<f32>,
    /// Vocabulary size `V`, the target's.
    pub vocab_size: usize,
    /// γ: block rows `[anchor, mask × (γ−1)]`.
    pub block_size: usize,
    /// Token id filling the γ−1 masked rows of a block.
    pub mask_token_id: u32,
    /// Target layers whose outputs are tapped, in feature order.
    pub target_layer_ids: Vec<usize>,
    /// Depth of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// 0 = no Markov head.
    pub markov_rank: usize,
    /// The checkpoint has a confidence head (per-position survival for pruning).
    pub enable_confidence_head: bool,
    /// Confidence input is `[h; markov_w1[prev]]` (else `[h]`).
    pub confidence_head_with_markov: bool,
    /// RoPE base frequency θ.
    pub rope_theta: f32,
    /// Which RoPE variant the backbone uses.
    pub rope: RopeKind,
    /// DeepSpec's truncation threshold (a call argument in DeepSeek's reference code; 0 = off).
    pub confidence_threshold: f32,
    /// The mlx-lm quantization block of quantized siblings.
    pub quantization: Option<QuantizationConfig>,
}

/// `config.json` as written, every key optional and typed; [`DeepSpecConfig`]'s `TryFrom`
/// applies the defaults and refusals. Unknown keys are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RawDeepSpecConfig {
    pub architectures: Option<Vec<String>>,
    pub attention_k_eq_v: Option<bool>,
    pub hidden_activation: Option<String>,
    pub hidden_size: Option<u64>,
    pub num_hidden_layers: Option<u64>,
    pub num_attention_heads: Option<u64>,
    pub global_head_dim: Option<u64>,
    pub num_global_key_value_heads: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub vocab_size: Option<u64>,
    pub block_size: Option<u64>,
    pub mask_token_id: Option<u64>,
    pub rms_norm_eps: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub target_layer_ids: Option<Vec<u64>>,
    pub num_target_layers: Option<u64>,
    pub markov_rank: Option<u64>,
    pub markov_head_type: Option<String>,
    pub enable_confidence_head: Option<bool>,
    pub confidence_head_with_markov: Option<bool>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_parameters: Option<RawRopeParameters>,
    pub confidence_threshold: Option<f64>,
    pub quantization: Option<Value>,
    pub quantization_config: Option<Value>,
}

/// `rope_parameters`: flat, or nested under `full_attention`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RawRopeParameters {
    pub full_attention: Option<RawRope>,
    #[serde(flatten)]
    pub flat: RawRope,
}

/// One RoPE parameter block.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct RawRope {
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub rope_type: Option<String>,
}

fn invalid(field: impl Into<String>, expected: impl Into<String>, got: impl std::fmt::Display) -> ConfigError {
    ConfigError::Invalid { field: field.into(), expected: expected.into(), got: got.to_string() }
}

fn in_file(e: ConfigError, path: &Path) -> ConfigError {
    ConfigError::InFile { path: path.to_path_buf(), source: Box::new(e) }
}

/// A required integer > 0 that fits the i32 shapes MLX uses.
fn positive(field: &str, v: Option<u64>) -> Result<usize, ConfigError> {
    match v {
        None => Err(invalid(field, "an integer > 0", "nothing (the key is required)")),
        Some(0) => Err(invalid(field, "an integer > 0", 0)),
        Some(x) if x > i32::MAX as u64 => Err(invalid(field, format!("an integer <= {}", i32::MAX), x)),
        Some(x) => Ok(x as usize),
    }
}

impl RawDeepSpecConfig {
    /// Parses config text; a value of the wrong JSON type is reported with its key.
    pub fn from_json_str(text: &str) -> Result<RawDeepSpecConfig, ConfigError> {
        let v: Value = serde_json::from_str(text).map_err(|source| ConfigError::Json { source })?;
        let Value::Object(map) = &v else {
            return Err(invalid("config", "a JSON object", kind_of(&v)));
        };
        RawDeepSpecConfig::deserialize(&v).map_err(|source| {
            // Find the key whose value alone fails to deserialize, so the error names it.
            let field = map
                .iter()
                .find(|(k, val)| {
                    let single = Value::Object(Map::from_iter([((*k).clone(), (*val).clone())]));
                    RawDeepSpecConfig::deserialize(&single).is_err()
                })
                .map_or_else(|| "config".to_string(), |(k, _)| k.clone());
            ConfigError::Type { field, source }
        })
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl DeepSpecConfig {
    /// Reads `dir/config.json`; errors name the file and the key.
    pub fn from_dir(dir: &Path) -> Result<DeepSpecConfig, ConfigError> {
        let path = dir.join("config.json");
        let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
            .map_err(|source| ConfigError::Io { path: path.clone(), source })?;
        DeepSpecConfig::from_json_str(&text).map_err(|e| in_file(e, &path))
    }

    /// Parses and validates config text.
    pub fn from_json_str(text: &str) -> Result<DeepSpecConfig, ConfigError> {
        DeepSpecConfig::try_from(RawDeepSpecConfig::from_json_str(text)?)
    }

    /// Query heads per KV head.
    pub fn gqa_groups(&self) -> usize {
        self.num_attention_heads / self.num_kv_heads
    }

    /// Input width of `fc`: taps · hidden.
    pub fn context_width(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    /// Input width of the confidence projection.
    pub fn confidence_width(&self) -> usize {
        self.hidden_size + if self.confidence_head_with_markov { self.markov_rank } else { 0 }
    }

    /// Rotated pairs of the proportional RoPE (`head_dim / 2` for plain RoPE).
    pub fn rotated_pairs(&self) -> usize {
        match self.rope {
            RopeKind::Proportional { partial_rotary_factor } => {
                ((self.head_dim as f64 * partial_rotary_factor).floor() as usize) / 2
            }
            RopeKind::Default => self.head_dim / 2,
        }
    }
}

impl TryFrom<RawDeepSpecConfig> for DeepSpecConfig {
    type Error = ConfigError;

    fn try_from(raw: RawDeepSpecConfig) -> Result<DeepSpecConfig, ConfigError> {
        let arch = raw.architectures.as_ref().and_then(|a| a.first());
        if arch.map(String::as_str) != Some(ARCHITECTURE) {
            let got = raw.architectures.as_ref().map_or_else(|| "nothing".to_string(), |a| format!("{a:?}"));
            return Err(invalid("architectures", format!("architectures[0] == \"{ARCHITECTURE}\""), got));
        }
        if raw.attention_k_eq_v != Some(true) {
            return Err(invalid(
                "attention_k_eq_v",
                "true (attention_k_eq_v=false checkpoints need a real v_proj path, which is not implemented)",
                format!("{:?}", raw.attention_k_eq_v),
            ));
        }
        let act = raw.hidden_activation.as_deref().unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return Err(invalid("hidden_activation", "\"gelu_pytorch_tanh\"", format!("\"{act}\"")));
        }
        let hidden_size = positive("hidden_size", raw.hidden_size)?;
        let num_hidden_layers = positive("num_hidden_layers", raw.num_hidden_layers)?;
        let num_attention_heads = positive("num_attention_heads", raw.num_attention_heads)?;
        let head_dim = positive("global_head_dim", raw.global_head_dim)?;
        let num_kv_heads = positive("num_global_key_value_heads", raw.num_global_key_value_heads)?;
        if !num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(invalid(
                "num_global_key_value_heads",
                format!("a divisor of num_attention_heads {num_attention_heads}"),
                num_kv_heads,
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(invalid("global_head_dim", "an even number (RoPE rotates pairs)", head_dim));
        }
        let intermediate_size = positive("intermediate_size", raw.intermediate_size)?;
        let vocab_size = positive("vocab_size", raw.vocab_size)?;
        let block_size = positive("block_size", raw.block_size)?;
        let mask_token_id = match raw.mask_token_id {
            None => return Err(invalid("mask_token_id", "a token id", "nothing (the key is required)")),
            Some(id) if id >= vocab_size as u64 => {
                return Err(invalid("mask_token_id", format!("an id inside the vocabulary ({vocab_size})"), id))
            }
            Some(id) => id as u32,
        };
        let eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(invalid("rms_norm_eps", "a finite number > 0", eps));
        }
        let final_logit_softcapping = match raw.final_logit_softcapping {
            None => None,
            Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
            Some(c) => return Err(invalid("final_logit_softcapping", "null or a number > 0", c)),
        };
        let target_layer_ids = match &raw.target_layer_ids {
            Some(ids) if !ids.is_empty() => ids.iter().map(|&x| x as usize).collect::<Vec<_>>(),
            _ => return Err(invalid("target_layer_ids", "a non-empty array of layer indices", "none")),
        };
        let num_target_layers = positive("num_target_layers", raw.num_target_layers)?;
        let markov_rank = match raw.markov_rank {
            Some(r) if r > i32::MAX as u64 => return Err(invalid("markov_rank", format!("<= {}", i32::MAX), r)),
            r => r.unwrap_or(0) as usize,
        };
        let head_type = raw.markov_head_type.as_deref().unwrap_or("vanilla");
        if markov_rank > 0 && head_type != "vanilla" {
            return Err(invalid(
                "markov_head_type",
                "\"vanilla\" (gated/rnn heads ship markov_w1/w2 too and would silently get vanilla math)",
                format!("\"{head_type}\""),
            ));
        }
        let enable_confidence_head = raw.enable_confidence_head.unwrap_or(false);
        let confidence_head_with_markov = raw.confidence_head_with_markov.unwrap_or(false);
        if enable_confidence_head && confidence_head_with_markov && markov_rank == 0 {
            return Err(invalid("confidence_head_with_markov", "markov_rank > 0 when true", "markov_rank 0"));
        }
        let (rope_theta, rope) = rope(&raw)?;
        let confidence_threshold = match raw.confidence_threshold {
            Some(t) if !(0.0..=1.0).contains(&t) => {
                return Err(invalid("confidence_threshold", "a number in [0, 1]", t));
            }
            t => t.unwrap_or(0.0) as f32,
        };
        let quantization = match (&raw.quantization, &raw.quantization_config) {
            (Some(q), _) => Some(QuantizationConfig::from_json(q, "quantization")?),
            (None, Some(q)) => Some(QuantizationConfig::from_json(q, "quantization_config")?),
            (None, None) => None,
        };
        Ok(DeepSpecConfig {
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            head_dim,
            num_kv_heads,
            intermediate_size,
            rms_norm_eps: eps as f32,
            final_logit_softcapping,
            vocab_size,
            block_size,
            mask_token_id,
            target_layer_ids,
            num_target_layers,
            markov_rank,
            enable_confidence_head,
            confidence_head_with_markov: enable_confidence_head && confidence_head_with_markov,
            rope_theta,
            rope,
            confidence_threshold,
            quantization,
        })
    }
}

/// `rope_parameters.full_attention.{…}`, else flat `rope_parameters.{…}`, else top-level
/// `rope_theta` / `partial_rotary_factor`; defaults θ = 1e6, factor = 1.0, proportional.
fn rope(raw: &RawDeepSpecConfig) -> Result<(f32, RopeKind), ConfigError> {
    let top = RawRope { rope_theta: raw.rope_theta, partial_rotary_factor: raw.partial_rotary_factor, rope_type: None };
    let (field, src) = match &raw.rope_parameters {
        Some(RawRopeParameters { full_attention: Some(full), .. }) => ("rope_parameters.full_attention.", full),
        Some(p) => ("rope_parameters.", &p.flat),
        None => ("", &top),
    };
    let theta = src.rope_theta.unwrap_or(1e6);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(invalid(format!("{field}rope_theta"), "a finite number > 0", theta));
    }
    let factor = src.partial_rotary_factor.unwrap_or(1.0);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(invalid(format!("{field}partial_rotary_factor"), "a number in (0, 1]", factor));
    }
    let kind = match src.rope_type.as_deref().unwrap_or("proportional") {
        "proportional" => RopeKind::Proportional { partial_rotary_factor: factor },
        "default" => RopeKind::Default,
        other => {
            return Err(invalid(format!("{field}rope_type"), "\"proportional\" or \"default\"", format!("\"{other}\"")))
        }
    };
    Ok((theta as f32, kind))
}

/// `dir/config.json`, for error messages.
pub(crate) fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
