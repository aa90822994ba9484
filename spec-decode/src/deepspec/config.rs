//! `config.json` of a DeepSpec checkpoint (DeepSeek `Gemma4DSparkModel`, spec §11.3), with the
//! keys, defaults and refusals of the reference reader. Every error names `config.json` (the
//! path) and the key. Each refusal guards a variant that would load cleanly and compute the
//! wrong math: `attention_k_eq_v = false` (needs a real v_proj), a non-vanilla Markov head
//! (gated/rnn ship the same tensors) and an activation other than `gelu_pytorch_tanh`.

use std::path::{Path, PathBuf};

use gemma4::config::QuantizationConfig;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The `architectures[0]` of a DeepSpec checkpoint (also the serve-time detection key).
pub const ARCHITECTURE: &str = "Gemma4DSparkModel";

/// How the backbone rotates q and k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeKind {
    /// `rotated_dims = floor(head_dim · partial_rotary_factor)` dims rotate with wavelengths
    /// θ^(2k/head_dim) (full head_dim divisor); the rest are the identity.
    Proportional { partial_rotary_factor: f64 },
    /// Plain RoPE over the whole head.
    Default,
}

/// The parsed, validated DeepSpec config.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpecConfig {
    pub hidden_size: usize,
    /// Drafter layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// `global_head_dim`.
    pub head_dim: usize,
    /// `num_global_key_value_heads` (K ≡ V).
    pub num_kv_heads: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub final_logit_softcapping: Option<f32>,
    pub vocab_size: usize,
    /// γ: block rows `[anchor, mask × (γ−1)]`.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// Target layers whose outputs are tapped, in feature order.
    pub target_layer_ids: Vec<usize>,
    /// Depth of the target the drafter was trained for.
    pub num_target_layers: usize,
    /// 0 = no Markov head.
    pub markov_rank: usize,
    pub enable_confidence_head: bool,
    /// Confidence input is `[h; markov_w1[prev]]` (else `[h]`).
    pub confidence_head_with_markov: bool,
    pub rope_theta: f32,
    pub rope: RopeKind,
    /// DeepSpec's truncation threshold (a call argument in the reference; 0 = off).
    pub confidence_threshold: f32,
    /// The mlx-lm quantization block of quantized siblings.
    pub quantization: Option<QuantizationConfig>,
}

/// Reads keys of one JSON object, naming `config.json` and the key in errors.
struct Keys<'a> {
    path: &'a Path,
    map: &'a Map<String, Value>,
}

impl<'a> Keys<'a> {
    fn err(&self, key: &str, detail: impl std::fmt::Display) -> Error {
        Error::checkpoint(self.path, format!("{key}: {detail}"))
    }

    /// The value unless absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.err(key, format!("expected a non-negative integer, got {v}"))),
        }
    }

    /// A required integer > 0.
    fn pos(&self, key: &str) -> Result<usize> {
        match self.opt_usize(key)? {
            None => Err(self.err(key, "missing (required)")),
            Some(0) => Err(self.err(key, "expected a value > 0, got 0")),
            Some(x) => Ok(x),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| self.err(key, format!("expected a number, got {v}"))),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(key, format!("expected true or false, got {v}"))),
        }
    }

    fn str_or(&self, key: &str, default: &'a str) -> Result<&'a str> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_str().ok_or_else(|| self.err(key, format!("expected a string, got {v}"))),
        }
    }
}

impl DeepSpecConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<DeepSpecConfig> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        DeepSpecConfig::from_json_str(&text, &path)
    }

    /// Parses config text; `path` names the file in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<DeepSpecConfig> {
        let v: Value = serde_json::from_str(text).map_err(|e| Error::checkpoint(path, format!("invalid JSON: {e}")))?;
        let Value::Object(map) = &v else {
            return Err(Error::checkpoint(path, "expected a JSON object"));
        };
        parse(&Keys { path, map })
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

fn parse(k: &Keys<'_>) -> Result<DeepSpecConfig> {
    let arch = k.get("architectures").and_then(|a| a.as_array()).and_then(|a| a.first()).and_then(|a| a.as_str());
    if arch != Some(ARCHITECTURE) {
        let got = k.get("architectures").map_or_else(|| "nothing".to_string(), |v| v.to_string());
        return Err(k.err("architectures", format!("expected architectures[0] == \"{ARCHITECTURE}\", got {got}")));
    }
    if k.get("attention_k_eq_v").and_then(Value::as_bool) != Some(true) {
        return Err(k.err(
            "attention_k_eq_v",
            "attention_k_eq_v=false checkpoints need a real v_proj path — not implemented (must be true)",
        ));
    }
    let act = k.str_or("hidden_activation", "gelu_pytorch_tanh")?;
    if act != "gelu_pytorch_tanh" {
        return Err(k.err("hidden_activation", format!("expected \"gelu_pytorch_tanh\", got \"{act}\"")));
    }
    let hidden_size = k.pos("hidden_size")?;
    let num_hidden_layers = k.pos("num_hidden_layers")?;
    let num_attention_heads = k.pos("num_attention_heads")?;
    let head_dim = k.pos("global_head_dim")?;
    let num_kv_heads = k.pos("num_global_key_value_heads")?;
    if num_attention_heads % num_kv_heads != 0 {
        return Err(k.err(
            "num_global_key_value_heads",
            format!("{num_kv_heads} does not divide num_attention_heads {num_attention_heads}"),
        ));
    }
    if head_dim % 2 != 0 {
        return Err(k.err("global_head_dim", format!("must be even for RoPE, got {head_dim}")));
    }
    let intermediate_size = k.pos("intermediate_size")?;
    let vocab_size = k.pos("vocab_size")?;
    let block_size = k.pos("block_size")?;
    let mask_token_id = match k.opt_usize("mask_token_id")? {
        None => return Err(k.err("mask_token_id", "missing (required)")),
        Some(id) if id >= vocab_size => {
            return Err(k.err("mask_token_id", format!("{id} is outside the vocabulary ({vocab_size})")))
        }
        Some(id) => id as u32,
    };
    let eps = k.opt_f64("rms_norm_eps")?.unwrap_or(1e-6);
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(k.err("rms_norm_eps", format!("expected a finite number > 0, got {eps}")));
    }
    let final_logit_softcapping = match k.opt_f64("final_logit_softcapping")? {
        None => None,
        Some(c) if c > 0.0 && c.is_finite() => Some(c as f32),
        Some(c) => return Err(k.err("final_logit_softcapping", format!("expected null or a number > 0, got {c}"))),
    };
    let target_layer_ids = match k.get("target_layer_ids").and_then(Value::as_array) {
        Some(ids) if !ids.is_empty() => ids
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as usize)
                    .ok_or_else(|| k.err("target_layer_ids", format!("expected layer indices, got {v}")))
            })
            .collect::<Result<Vec<_>>>()?,
        _ => return Err(k.err("target_layer_ids", "must be a non-empty array of layer indices")),
    };
    let num_target_layers = k.pos("num_target_layers")?;
    let markov_rank = k.opt_usize("markov_rank")?.unwrap_or(0);
    let head_type = k.str_or("markov_head_type", "vanilla")?;
    if markov_rank > 0 && head_type != "vanilla" {
        return Err(k.err(
            "markov_head_type",
            format!("\"{head_type}\" is not supported: gated/rnn heads ship markov_w1/w2 too and would silently get vanilla math (only \"vanilla\")"),
        ));
    }
    let enable_confidence_head = k.bool_or("enable_confidence_head", false)?;
    let confidence_head_with_markov = k.bool_or("confidence_head_with_markov", false)?;
    if enable_confidence_head && confidence_head_with_markov && markov_rank == 0 {
        return Err(k.err("confidence_head_with_markov", "requires markov_rank > 0"));
    }
    let (rope_theta, rope) = parse_rope(k)?;
    let confidence_threshold = k.opt_f64("confidence_threshold")?.unwrap_or(0.0) as f32;
    let quantization = parse_quantization(k)?;
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

/// `rope_parameters.full_attention.{…}`, else flat `rope_parameters.{…}`, else top-level
/// `rope_theta` / `partial_rotary_factor`; defaults θ = 1e6, factor = 1.0, proportional.
fn parse_rope(k: &Keys<'_>) -> Result<(f32, RopeKind)> {
    let params = k.get("rope_parameters").and_then(Value::as_object);
    let (field, src) = match params {
        Some(p) if p.get("full_attention").is_some_and(Value::is_object) => {
            ("rope_parameters.full_attention", p.get("full_attention").and_then(Value::as_object))
        }
        Some(p) => ("rope_parameters", Some(p)),
        None => ("", None),
    };
    let inner = src.map(|map| Keys { path: k.path, map });
    let num = |key: &str| -> Result<Option<f64>> {
        match &inner {
            Some(i) => match i.opt_f64(key) {
                Ok(v) => Ok(v),
                Err(_) => Err(k.err(&format!("{field}.{key}"), "expected a number")),
            },
            None => k.opt_f64(key),
        }
    };
    let named = |key: &str| if field.is_empty() { key.to_string() } else { format!("{field}.{key}") };
    let theta = num("rope_theta")?.unwrap_or(1e6);
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(k.err(&named("rope_theta"), format!("expected a finite number > 0, got {theta}")));
    }
    let factor = num("partial_rotary_factor")?.unwrap_or(1.0);
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(k.err(&named("partial_rotary_factor"), format!("expected a number in (0, 1], got {factor}")));
    }
    let rope_type = inner.as_ref().and_then(|i| i.get("rope_type")).and_then(Value::as_str).unwrap_or("proportional");
    let kind = match rope_type {
        "proportional" => RopeKind::Proportional { partial_rotary_factor: factor },
        "default" => RopeKind::Default,
        other => {
            return Err(k.err(&named("rope_type"), format!("expected \"proportional\" or \"default\", got \"{other}\"")))
        }
    };
    Ok((theta as f32, kind))
}

fn parse_quantization(k: &Keys<'_>) -> Result<Option<QuantizationConfig>> {
    for key in ["quantization", "quantization_config"] {
        if let Some(block) = k.get(key) {
            let q = QuantizationConfig::from_json(block, key).map_err(|e| Error::checkpoint(k.path, e.to_string()))?;
            return Ok(Some(q));
        }
    }
    Ok(None)
}

/// `dir/config.json`, for error messages.
pub(crate) fn config_path(dir: &Path) -> PathBuf {
    dir.join("config.json")
}
