//! The MLX `quantization` block: a default spec plus per-module overrides.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::error::{invalid, ConfigError};

/// One quantization type for configs, loaders and writers: mlx-core's validated spec (MLX's
/// affine mode, the only one supported; other modes are refused when the config is parsed).
pub use mlx_core::quant::QuantSpec;

/// The MLX `quantization` block: a default plus per-module-path overrides, where
/// `None` means "leave this module unquantized" (a `false` entry).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuantizationConfig {
    /// Bits and group size for modules without an override; `None` when the block has none.
    pub default: Option<QuantSpec>,
    /// Per-module-path settings, keyed by module path as the checkpoint
    /// names it; `None` keeps the module dense.
    pub overrides: BTreeMap<String, Option<QuantSpec>>,
}

impl QuantizationConfig {
    /// The spec for a module path such as `language_model.model.layers.0.router.proj`.
    pub fn spec_for(&self, module_path: &str) -> Option<QuantSpec> {
        match self.overrides.get(module_path) {
            Some(spec) => *spec,
            None => self.default,
        }
    }

    /// Parses an mlx-lm `quantization` block; `field` names it in errors (e.g. `quantization`).
    pub fn from_json(block: &Value, field: &str) -> Result<QuantizationConfig, ConfigError> {
        parse_quant(block, field)
    }

    /// The block as mlx-lm writes it (`false` for unquantized overrides).
    pub fn to_json_value(&self) -> Value {
        let spec = |s: &QuantSpec| json!({"group_size": s.group_size(), "bits": s.bits(), "mode": "affine"});
        let mut map = match self.default.as_ref().map(spec) {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for (path, s) in &self.overrides {
            map.insert(path.clone(), s.as_ref().map_or(Value::Bool(false), spec));
        }
        Value::Object(map)
    }
}

const QUANT_KEYS: [&str; 3] = ["group_size", "bits", "mode"];

fn unsupported(field: String, mode: &Value) -> ConfigError {
    let mode = mode.as_str().map_or_else(|| mode.to_string(), str::to_owned);
    ConfigError::UnsupportedQuantMode { field, mode }
}

pub(crate) fn parse_quant(block: &Value, field: &str) -> Result<QuantizationConfig, ConfigError> {
    let Value::Object(map) = block else {
        return Err(invalid(field, "an object", block));
    };
    // HF-style blocks (awq, gptq, mxfp4, ...) name a method instead of MLX's keys.
    if let Some(method) = map.get("quant_method") {
        return Err(unsupported(format!("{field}.quant_method"), method));
    }
    let has_default = QUANT_KEYS.iter().any(|k| map.contains_key(*k));
    let default = has_default.then(|| quant_spec(map, field)).transpose()?;
    let mut overrides = BTreeMap::new();
    for (key, value) in map.iter().filter(|(k, _)| !QUANT_KEYS.contains(&k.as_str())) {
        let f = format!("{field}.{key}");
        let spec = match value {
            Value::Bool(false) => None,
            Value::Bool(true) => Some(default.ok_or_else(|| invalid(&f, "false or an object (no default)", true))?),
            Value::Object(o) => Some(quant_spec(o, &f)?),
            other => return Err(invalid(f, "an object {group_size, bits[, mode]} or a bool", other)),
        };
        overrides.insert(key.clone(), spec);
    }
    Ok(QuantizationConfig { default, overrides })
}

fn quant_spec(map: &Map<String, Value>, field: &str) -> Result<QuantSpec, ConfigError> {
    // Mode first: a non-affine block is refused for its mode, not its group size.
    match map.get("mode") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "affine" => {}
        Some(other) => return Err(unsupported(format!("{field}.mode"), other)),
    }
    let pick = |key: &str, allowed: &[u32]| {
        let v = map.get(key);
        match v.and_then(Value::as_u64) {
            Some(x) if allowed.iter().any(|&a| u64::from(a) == x) => Ok(x as u32),
            _ => Err(invalid(format!("{field}.{key}"), format!("one of {allowed:?}"), v.unwrap_or(&Value::Null))),
        }
    };
    let group_size = pick("group_size", &mlx_core::quant::SUPPORTED_GROUP_SIZES)?;
    let bits = pick("bits", &mlx_core::quant::SUPPORTED_BITS)?;
    QuantSpec::new(bits, group_size).map_err(|e| invalid(field.to_string(), "a supported quantization", e))
}
