//! Gemma-4 `config.json` → validated [`TextConfig`] (docs/gemma4.md §2, §3.5, §3.6, §5.1).
//!
//! Two stages: [`RawTextConfig`] mirrors the JSON (every field optional), and
//! `TextConfig::try_from(raw)` resolves the layout, applies mlx-lm's defaults, validates, and
//! derives the per-layer facts once, so model code never re-reads strings or re-derives donors.
//!
//! Absent fields take mlx-lm's `gemma4_text.ModelArgs` defaults, which are **E2B's** (§2.1):
//! a missing field silently means an E2B value. That is why [`TextConfig::to_json_value`]
//! writes every field explicitly.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

/// Why a config was refused. Every variant names the field (dotted path, e.g.
/// `text_config.layer_types[3]`); [`ConfigError::InFile`] adds the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    /// Malformed JSON; serde_json's message carries the line and column.
    #[error("invalid JSON: {source}")]
    Json { source: serde_json::Error },
    /// A field holds a JSON value of the wrong type.
    #[error("{field}: {source}")]
    Type { field: String, source: serde_json::Error },
    #[error("{field}: expected {expected}, got {got}")]
    Invalid { field: String, expected: String, got: String },
    #[error("{field}: quantization mode \"{mode}\" is not supported (only \"affine\" is)")]
    UnsupportedQuantMode { field: String, mode: String },
    #[error("{}: {source}", path.display())]
    InFile { path: PathBuf, source: Box<ConfigError> },
}

impl ConfigError {
    fn in_file(self, path: &Path) -> Self {
        ConfigError::InFile { path: path.to_path_buf(), source: Box::new(self) }
    }
}

fn invalid(field: impl Into<String>, want: impl Into<String>, got: impl Display) -> ConfigError {
    let (field, expected, got) = (field.into(), want.into(), got.to_string());
    ConfigError::Invalid { field, expected, got }
}

/// Attention type of one layer; selects head dim, RoPE, mask and cache type (§2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LayerKind {
    #[serde(rename = "sliding_attention")]
    Sliding,
    #[serde(rename = "full_attention")]
    Full,
}

impl LayerKind {
    /// The `layer_types` / `rope_parameters` key.
    pub const fn as_str(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Full => "full_attention",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [LayerKind::Sliding, LayerKind::Full].into_iter().find(|k| k.as_str() == s)
    }
}

/// The two RoPE variants Gemma 4 uses (§3.6); mlx-lm's other types never occur here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeType {
    /// `nn.RoPE` over the whole head; `partial_rotary_factor` and `factor` are ignored.
    Default,
    /// `ProportionalRoPE`: `rotary_dims` pairs rotate, exponents divide by the full head dim.
    Proportional,
}

impl RopeType {
    pub const fn as_str(self) -> &'static str {
        match self {
            RopeType::Default => "default",
            RopeType::Proportional => "proportional",
        }
    }
}

/// RoPE parameters of one layer kind. f32 because MLX rounds Python floats to f32 (§3.0).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    pub rope_type: RopeType,
    pub theta: f32,
    pub partial_rotary_factor: f32,
    pub factor: f32,
}

/// Where a layer's K/V come from (§3.5, §5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// Donor layer with its own projections and cache; `cache_index` in `0..num_caches()`.
    Own { cache_index: usize },
    /// KV-shared layer: no k/v weights, no cache; reads `donor`'s fetched K/V and offset.
    Shared { donor: usize },
}

/// Everything one decoder layer needs, derived once.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    pub kind: LayerKind,
    /// `head_dim` for sliding layers, `global_head_dim` for full ones.
    pub head_dim: usize,
    pub n_kv_heads: usize,
    pub n_heads: usize,
    pub rope: RopeSpec,
    /// `int(head_dim * partial_rotary_factor)` for proportional RoPE, else `head_dim`.
    pub rotary_dims: usize,
    pub kv: KvSource,
    /// False iff a full layer with `attention_k_eq_v` (V is the raw k_proj output). Shared
    /// layers have no k/v weights at all regardless; see `kv`.
    pub has_v_proj: bool,
    /// `2 × intermediate_size` for shared layers under `use_double_wide_mlp`.
    pub mlp_width: usize,
}

/// Which JSON layout the config used; weight-name prefixes depend on it (§4.1, §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `model_type: "gemma4_text"`, fields at top level, weights `model.*`.
    Flat,
    /// `model_type: "gemma4"` / `"gemma4_unified"`, decoder under `text_config`.
    Nested,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMode {
    Affine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSpec {
    pub group_size: u32,
    pub bits: u32,
    pub mode: QuantMode,
}

/// The MLX `quantization` block (§4.4): a default plus per-module-path overrides, where
/// `None` means "leave this module unquantized" (a `false` entry).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QuantizationConfig {
    pub default: Option<QuantSpec>,
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
        let spec = |s: &QuantSpec| json!({"group_size": s.group_size, "bits": s.bits, "mode": "affine"});
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

fn parse_quant(block: &Value, field: &str) -> Result<QuantizationConfig, ConfigError> {
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
    let mode = match map.get("mode") {
        None | Some(Value::Null) => QuantMode::Affine,
        Some(Value::String(s)) if s == "affine" => QuantMode::Affine,
        Some(other) => return Err(unsupported(format!("{field}.mode"), other)),
    };
    let pick = |key: &str, allowed: &[u32]| {
        let v = map.get(key);
        match v.and_then(Value::as_u64) {
            Some(x) if allowed.iter().any(|&a| u64::from(a) == x) => Ok(x as u32),
            _ => Err(invalid(format!("{field}.{key}"), format!("one of {allowed:?}"), v.unwrap_or(&Value::Null))),
        }
    };
    let group_size = pick("group_size", &[32, 64, 128])?;
    Ok(QuantSpec { group_size, bits: pick("bits", &[2, 3, 4, 5, 6, 8])?, mode })
}

/// One `rope_parameters` entry as written. Floats are f64 so `int(dims * factor)` matches
/// Python's double arithmetic.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RawRope {
    pub rope_type: Option<String>,
    /// Legacy spelling; mlx-lm prefers it over `rope_type` when non-empty.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub factor: Option<f64>,
}

/// `config.json` as written, for both layouts: the nested decoder is `text_config`.
/// `Some(None)` on the double options means an explicit `null`, which differs from absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RawTextConfig {
    pub model_type: Option<String>,
    pub text_config: Option<Box<RawTextConfig>>,
    pub hidden_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub num_global_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    /// `null` falls back to `head_dim`, as mlx-lm's truthiness test does.
    #[serde(deserialize_with = "present")]
    pub global_head_dim: Option<Option<usize>>,
    pub attention_k_eq_v: Option<bool>,
    pub num_kv_shared_layers: Option<usize>,
    /// `null` disables PLE, like 0.
    #[serde(deserialize_with = "present")]
    pub hidden_size_per_layer_input: Option<Option<usize>>,
    pub vocab_size: Option<usize>,
    pub vocab_size_per_layer_input: Option<usize>,
    pub use_double_wide_mlp: Option<bool>,
    /// `null` disables the softcap.
    #[serde(deserialize_with = "present")]
    pub final_logit_softcapping: Option<Option<f64>>,
    pub sliding_window: Option<usize>,
    pub sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    pub sliding_window_pattern_alias: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub rope_parameters: Option<BTreeMap<String, RawRope>>,
    pub rms_norm_eps: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    pub enable_moe_block: Option<bool>,
    pub num_experts: Option<usize>,
    pub top_k_experts: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    #[serde(deserialize_with = "token_ids")]
    pub eos_token_id: Option<Vec<u32>>,
    pub bos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    pub quantization: Option<Value>,
    pub quantization_config: Option<Value>,
}

fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `eos_token_id` is an int or a list of ints.
fn token_ids<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u32>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Ids {
        One(u32),
        Many(Vec<u32>),
    }
    Ok(Option::<Ids>::deserialize(d)?.map(|ids| match ids {
        Ids::One(id) => vec![id],
        Ids::Many(ids) => ids,
    }))
}

impl RawTextConfig {
    /// Parses `config.json` text. Type errors name the offending field, found by
    /// re-deserializing one key at a time (serde_json itself only gives line/column).
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
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

/// The validated, typed decoder config. Model code reads only this.
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub layout: Layout,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    /// KV heads of sliding layers, and of full layers unless k_eq_v applies.
    pub num_key_value_heads: usize,
    /// KV heads of full layers, only when `attention_k_eq_v` (ignored otherwise, as in mlx-lm).
    pub num_global_key_value_heads: Option<usize>,
    pub head_dim: usize,
    pub global_head_dim: usize,
    pub attention_k_eq_v: bool,
    pub num_kv_shared_layers: usize,
    /// `num_hidden_layers − num_kv_shared_layers`: the number of donor layers and caches.
    pub first_kv_shared: usize,
    /// PLE width; 0 means PLE off.
    pub hidden_size_per_layer_input: usize,
    pub vocab_size: usize,
    pub vocab_size_per_layer_input: usize,
    pub use_double_wide_mlp: bool,
    pub final_logit_softcapping: Option<f32>,
    pub sliding_window: usize,
    pub rms_norm_eps: f32,
    /// False means the checkpoint has an `lm_head`.
    pub tie_word_embeddings: bool,
    pub enable_moe_block: bool,
    pub num_experts: Option<usize>,
    pub top_k_experts: Option<usize>,
    pub moe_intermediate_size: Option<usize>,
    /// Numerically irrelevant for default/proportional RoPE; kept so configs round-trip.
    pub max_position_embeddings: usize,
    /// Stop ids: top-level `eos_token_id`, overridden by generation_config.json in `from_dir`.
    pub eos_token_ids: Vec<u32>,
    pub bos_token_id: u32,
    pub pad_token_id: u32,
    pub layers: Vec<LayerSpec>,
    pub quantization: Option<QuantizationConfig>,
}

/// Field naming and checks for one decoder block (prefix `""` or `"text_config."`).
struct Check<'a>(&'a str);

impl Check<'_> {
    fn bad(&self, f: &str, expected: impl Into<String>, got: impl Display) -> ConfigError {
        invalid(format!("{}{f}", self.0), expected, got)
    }

    /// `v`, or mlx-lm's default when absent; must be > 0.
    fn pos(&self, f: &str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
        match v.unwrap_or(default) {
            0 => Err(self.bad(f, "a value > 0", 0)),
            x => Ok(x),
        }
    }

    fn pos_f32(&self, f: &str, v: Option<f64>, default: f64) -> Result<f32, ConfigError> {
        let x = v.unwrap_or(default);
        match x as f32 {
            y if y.is_finite() && y > 0.0 => Ok(y),
            _ => Err(self.bad(f, "a finite number > 0", x)),
        }
    }
}

/// mlx-lm's `rope_parameters` default, used only when the whole field is absent or null.
fn default_rope_parameters() -> BTreeMap<String, RawRope> {
    let entry = |ty: &str, theta: f64, partial: f64| RawRope {
        rope_type: Some(ty.into()),
        rope_theta: Some(theta),
        partial_rotary_factor: Some(partial),
        ..RawRope::default()
    };
    BTreeMap::from([
        ("full_attention".into(), entry("proportional", 1e6, 0.25)),
        ("sliding_attention".into(), entry("default", 1e4, 1.0)),
    ])
}

/// The spec plus the f64 partial factor, for the Python-exact `int(dims * factor)`.
fn rope_spec(c: &Check<'_>, key: &str, raw: &RawRope) -> Result<(RopeSpec, f64), ConfigError> {
    let ty = raw.type_.as_deref().filter(|s| !s.is_empty());
    let rope_type = match ty.or(raw.rope_type.as_deref()).unwrap_or("default") {
        "default" => RopeType::Default,
        "proportional" => RopeType::Proportional,
        other => {
            let f = format!("{key}.rope_type");
            return Err(c.bad(&f, r#""default" or "proportional""#, format!("{other:?}")));
        }
    };
    let partial = raw.partial_rotary_factor.unwrap_or(1.0);
    let spec = RopeSpec {
        rope_type,
        theta: c.pos_f32(&format!("{key}.rope_theta"), raw.rope_theta, 1e4)?,
        partial_rotary_factor: c.pos_f32(&format!("{key}.partial_rotary_factor"), Some(partial), 1.0)?,
        factor: c.pos_f32(&format!("{key}.factor"), raw.factor, 1.0)?,
    };
    Ok((spec, partial))
}

const KIND_NAMES: &str = r#""sliding_attention" or "full_attention""#;
const VOCAB: usize = 262_144;

impl TryFrom<RawTextConfig> for TextConfig {
    type Error = ConfigError;

    fn try_from(mut raw: RawTextConfig) -> Result<Self, ConfigError> {
        let (layout, c) = match raw.model_type.as_deref() {
            Some("gemma4_text") => (Layout::Flat, Check("")),
            Some("gemma4" | "gemma4_unified") => (Layout::Nested, Check("text_config.")),
            other => {
                let got = other.map_or_else(|| "nothing".into(), |s| format!("{s:?}"));
                let expected = r#""gemma4_text", "gemma4" or "gemma4_unified""#;
                return Err(invalid("model_type", expected, got));
            }
        };
        let nested = match layout {
            Layout::Flat => None,
            Layout::Nested => Some(raw.text_config.take().map(|b| *b).unwrap_or_default()),
        };
        let top = raw;
        let t = nested.as_ref().unwrap_or(&top);

        let hidden_size = c.pos("hidden_size", t.hidden_size, 1536)?;
        let n = c.pos("num_hidden_layers", t.num_hidden_layers, 35)?;
        let intermediate_size = c.pos("intermediate_size", t.intermediate_size, 6144)?;
        // gemma4.ModelArgs fills 8 / 1 when absent: the same as gemma4_text's defaults.
        let n_heads = c.pos("num_attention_heads", t.num_attention_heads, 8)?;
        let n_kv = c.pos("num_key_value_heads", t.num_key_value_heads, 1)?;
        let n_global_kv = t.num_global_key_value_heads;
        let n_global_kv = n_global_kv.map(|v| c.pos("num_global_key_value_heads", Some(v), v));
        let n_global_kv = n_global_kv.transpose()?;
        let head_dim = c.pos("head_dim", t.head_dim, 256)?;
        let global_head_dim = t.global_head_dim.map(|v| v.unwrap_or(head_dim));
        let global_head_dim = c.pos("global_head_dim", global_head_dim, 512)?;
        let k_eq_v = t.attention_k_eq_v.unwrap_or(false);
        let shared = t.num_kv_shared_layers.unwrap_or(20);
        if shared >= n {
            let expected = format!("a value < num_hidden_layers ({n})");
            return Err(c.bad("num_kv_shared_layers", expected, shared));
        }
        let ple = t.hidden_size_per_layer_input.map_or(256, Option::unwrap_or_default);
        let vocab_size_per_layer_input = t.vocab_size_per_layer_input.unwrap_or(VOCAB);
        if ple > 0 && vocab_size_per_layer_input == 0 {
            let expected = "a value > 0 when hidden_size_per_layer_input > 0";
            return Err(c.bad("vocab_size_per_layer_input", expected, 0));
        }
        // Nested: mlx-lm overwrites text_config.vocab_size with the top-level one.
        let vocab_size = match layout {
            Layout::Flat => c.pos("vocab_size", t.vocab_size, VOCAB)?,
            Layout::Nested => Check("").pos("vocab_size", top.vocab_size, VOCAB)?,
        };
        if ple > 0 && vocab_size_per_layer_input < vocab_size {
            // Every token id indexes the per-layer table too; a smaller table would be read out of range.
            let expected = format!("a value >= vocab_size ({vocab_size}) when hidden_size_per_layer_input > 0");
            return Err(c.bad("vocab_size_per_layer_input", expected, vocab_size_per_layer_input));
        }
        let softcap = t.final_logit_softcapping.unwrap_or(Some(30.0));
        let softcap = softcap.map(|x| c.pos_f32("final_logit_softcapping", Some(x), x));
        let softcap = softcap.transpose()?;
        let sliding_window = c.pos("sliding_window", t.sliding_window, 512)?;
        let rms_norm_eps = c.pos_f32("rms_norm_eps", t.rms_norm_eps, 1e-6)?;

        let enable_moe_block = t.enable_moe_block.unwrap_or(false);
        if enable_moe_block {
            let need = |f: &str, v: Option<usize>| {
                let v = v.ok_or_else(|| c.bad(f, "a value with enable_moe_block", "none"))?;
                c.pos(f, Some(v), v)
            };
            let experts = need("num_experts", t.num_experts)?;
            let top_k = need("top_k_experts", t.top_k_experts)?;
            need("moe_intermediate_size", t.moe_intermediate_size)?;
            if top_k > experts {
                let expected = format!("at most num_experts ({experts})");
                return Err(c.bad("top_k_experts", expected, top_k));
            }
        }

        // mlx-lm's default: the pattern repeated and cut; no last-layer forcing (HF does that).
        let kinds: Vec<LayerKind> = match &t.layer_types {
            Some(list) if list.len() != n => {
                let expected = format!("{n} entries (num_hidden_layers)");
                return Err(c.bad("layer_types", expected, format!("{} entries", list.len())));
            }
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let bad = || c.bad(&format!("layer_types[{i}]"), KIND_NAMES, format!("{s:?}"));
                    LayerKind::parse(s).ok_or_else(bad)
                })
                .collect::<Result<_, _>>()?,
            None => {
                let pattern = t.sliding_window_pattern.or(t.sliding_window_pattern_alias);
                let p = c.pos("sliding_window_pattern", pattern, 5)?;
                let kinds = [LayerKind::Sliding, LayerKind::Full];
                (0..n).map(|i| kinds[usize::from(i % p == p - 1)]).collect()
            }
        };

        let rope_params = t.rope_parameters.clone();
        let rope_params = rope_params.unwrap_or_else(default_rope_parameters);
        let first_kv_shared = n - shared;
        let double_wide = t.use_double_wide_mlp.unwrap_or(true);
        let mut layers = Vec::with_capacity(n);
        for (i, &kind) in kinds.iter().enumerate() {
            let key = format!("rope_parameters.{}", kind.as_str());
            let raw_rope = rope_params.get(kind.as_str());
            let raw_rope = raw_rope.ok_or_else(|| c.bad(&key, "an entry", "none"))?;
            let (rope, partial) = rope_spec(&c, &key, raw_rope)?;
            let (dim, dim_field) = match kind {
                LayerKind::Sliding => (head_dim, "head_dim"),
                LayerKind::Full => (global_head_dim, "global_head_dim"),
            };
            let rotary_dims = match rope.rope_type {
                RopeType::Default => dim,
                RopeType::Proportional => (dim as f64 * partial) as usize,
            };
            if rotary_dims % 2 != 0 || rotary_dims > dim {
                let f = match rope.rope_type {
                    RopeType::Default => dim_field.to_string(),
                    RopeType::Proportional => format!("{key}.partial_rotary_factor"),
                };
                let expected = format!("an even rotated width <= {dim_field} ({dim})");
                return Err(c.bad(&f, expected, format!("{rotary_dims} rotated dims")));
            }
            let (n_kv_heads, kv_field) = match (kind, k_eq_v, n_global_kv) {
                (LayerKind::Full, true, Some(g)) => (g, "num_global_key_value_heads"),
                _ => (n_kv, "num_key_value_heads"),
            };
            if n_heads % n_kv_heads != 0 {
                let expected = format!("a divisor of num_attention_heads ({n_heads})");
                return Err(c.bad(kv_field, expected, n_kv_heads));
            }
            let kv = if i < first_kv_shared {
                KvSource::Own { cache_index: i }
            } else {
                // mlx-lm's `previous_kvs`: the last donor layer of the same kind.
                let donor = kinds[..first_kv_shared].iter().rposition(|&k| k == kind);
                let expected = format!("a {} donor layer below {first_kv_shared}", kind.as_str());
                let donor = donor.ok_or_else(|| c.bad("num_kv_shared_layers", expected, shared))?;
                KvSource::Shared { donor }
            };
            let mlp_width = match i >= first_kv_shared && double_wide {
                true => intermediate_size.checked_mul(2),
                false => Some(intermediate_size),
            };
            let too_big = || c.bad("intermediate_size", "a doublable size", intermediate_size);
            layers.push(LayerSpec {
                kind,
                head_dim: dim,
                n_kv_heads,
                n_heads,
                rope,
                rotary_dims,
                kv,
                has_v_proj: !(kind == LayerKind::Full && k_eq_v),
                mlp_width: mlp_width.ok_or_else(too_big)?,
            });
        }

        let text_quant = nested.as_ref().and_then(|t| t.quantization_config.as_ref());
        let quantization = [
            (top.quantization.as_ref(), "quantization"),
            (top.quantization_config.as_ref(), "quantization_config"),
            (text_quant, "text_config.quantization_config"),
        ];
        let quantization = quantization.into_iter().find_map(|(q, f)| Some(parse_quant(q?, f)));

        // The stop set comes from the top level (§2.5); text_config's is a fallback.
        let eos = top.eos_token_id.as_ref().or(t.eos_token_id.as_ref());
        Ok(TextConfig {
            layout,
            hidden_size,
            num_hidden_layers: n,
            intermediate_size,
            num_attention_heads: n_heads,
            num_key_value_heads: n_kv,
            num_global_key_value_heads: n_global_kv,
            head_dim,
            global_head_dim,
            attention_k_eq_v: k_eq_v,
            num_kv_shared_layers: shared,
            first_kv_shared,
            hidden_size_per_layer_input: ple,
            vocab_size,
            vocab_size_per_layer_input,
            use_double_wide_mlp: double_wide,
            final_logit_softcapping: softcap,
            sliding_window,
            rms_norm_eps,
            tie_word_embeddings: t.tie_word_embeddings.unwrap_or(true),
            enable_moe_block,
            num_experts: t.num_experts,
            top_k_experts: t.top_k_experts,
            moe_intermediate_size: t.moe_intermediate_size,
            max_position_embeddings: t.max_position_embeddings.unwrap_or(131_072),
            eos_token_ids: eos.cloned().unwrap_or_else(|| vec![1]),
            bos_token_id: t.bos_token_id.or(top.bos_token_id).unwrap_or(2),
            pad_token_id: t.pad_token_id.or(top.pad_token_id).unwrap_or(0),
            layers,
            quantization: quantization.transpose()?,
        })
    }
}

/// An f32 as the JSON number of its shortest decimal form (1e-6, not 9.99999997e-7).
fn f32_json(x: f32) -> Value {
    Value::from(x.to_string().parse::<f64>().unwrap_or(f64::from(x)))
}

fn read(path: &Path) -> Result<String, ConfigError> {
    let io = |source| ConfigError::Io { path: path.to_path_buf(), source };
    std::fs::read_to_string(path).map_err(io)
}

/// Reads generation_config.json's `eos_token_id` the way mlx-lm's `load_config` does: an
/// undecodable file is ignored, and a falsy value (null, false, 0, []) does not override.
fn generation_eos(path: &Path) -> Result<Option<Vec<u32>>, ConfigError> {
    if !path.exists() {
        return Ok(None);
    }
    let value = serde_json::from_str::<Value>(&read(path)?).unwrap_or(Value::Null);
    let eos = match value.get("eos_token_id") {
        None | Some(Value::Null | Value::Bool(false)) => return Ok(None),
        Some(Value::Number(n)) if n.as_u64() == Some(0) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(v) => v,
    };
    let field = "eos_token_id".to_string();
    token_ids(eos).map_err(|source| ConfigError::Type { field, source }.in_file(path))
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
        if let Some(ids) = generation_eos(&dir.join("generation_config.json"))? {
            cfg.eos_token_ids = ids;
        }
        Ok(cfg)
    }

    /// Layer `i`. Panics if `i >= num_hidden_layers`, like slice indexing.
    pub fn layer(&self, i: usize) -> &LayerSpec {
        &self.layers[i]
    }

    /// One cache per donor layer (§5.1).
    pub fn num_caches(&self) -> usize {
        self.first_kv_shared
    }

    pub fn has_ple(&self) -> bool {
        self.hidden_size_per_layer_input > 0
    }

    /// A complete flat `gemma4_text` config.json with every field explicit (§9.2), so no
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

/// §9.1 config A ("E-style") as flat JSON: PLE, KV sharing of both kinds, double-wide MLP,
/// partial RoPE, window 8, GQA 2, softcap.
fn tiny_config_a_json() -> Value {
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

/// §9.1 config B ("26B/31B-style"): A with MoE and k_eq_v full layers, no PLE or sharing.
fn tiny_config_b_json() -> Value {
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

/// §9.1 config A, parsed through validation. The JSON is a constant, so failure is a bug here.
pub fn tiny_config_a() -> TextConfig {
    TextConfig::from_json_str(&tiny_config_a_json().to_string()).expect("tiny config A is valid")
}

/// §9.1 config B, parsed through validation.
pub fn tiny_config_b() -> TextConfig {
    TextConfig::from_json_str(&tiny_config_b_json().to_string()).expect("tiny config B is valid")
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
