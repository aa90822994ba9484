//! `RawTextConfig` → `TextConfig`: layout resolution, mlx-lm's defaults, validation, and the
//! per-layer derivation.

use std::collections::BTreeMap;
use std::fmt::Display;

use super::error::{invalid, ConfigError};
use super::layer_spec::{KvSource, LayerKind, LayerSpec, Layout, RopeSpec, RopeType};
use super::quant::parse_quant;
use super::raw::{RawRope, RawTextConfig};
use super::TextConfig;

/// Field naming and checks for one decoder block (prefix `""` or `"text_config."`).
struct Check<'a>(&'a str);

impl Check<'_> {
    fn bad(&self, f: &str, expected: impl Into<String>, got: impl Display) -> ConfigError {
        invalid(format!("{}{f}", self.0), expected, got)
    }

    /// `v`, or mlx-lm's default when absent; must be > 0 and fit an MLX (i32) dimension.
    fn pos(&self, f: &str, v: Option<usize>, default: usize) -> Result<usize, ConfigError> {
        match v.unwrap_or(default) {
            0 => Err(self.bad(f, "a value > 0", 0)),
            x => self.fits(f, x),
        }
    }

    /// `x` if it fits an MLX dimension (shapes are i32): narrowing would silently wrap it.
    fn fits(&self, f: &str, x: usize) -> Result<usize, ConfigError> {
        match i32::try_from(x) {
            Ok(_) => Ok(x),
            Err(_) => Err(self.bad(f, format!("at most {} (MLX shapes are i32)", i32::MAX), x)),
        }
    }

    /// `a × b`, a tensor dimension (or element count) that must fit i32; `f` names both fields.
    fn product(&self, f: &str, a: usize, b: usize) -> Result<usize, ConfigError> {
        let p = a.checked_mul(b).filter(|&p| i32::try_from(p).is_ok());
        let limit = format!("a product of at most {} (MLX shapes are i32)", i32::MAX);
        p.ok_or_else(|| self.bad(f, limit, format!("{a} × {b} = {}", a as u128 * b as u128)))
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

/// Stop ids must lie inside the vocabulary. An explicit `null` or `[]` says the config has no
/// stop ids: then, as in mlx-lm, the tokenizer's eos token stops generation
/// (`tokenizer::stop_tokens`). The error's field is filled in by the caller, which knows which
/// file and block the list came from.
pub(crate) fn check_eos(ids: &[u32], vocab_size: usize) -> Result<Vec<u32>, ConfigError> {
    let want = format!("token ids below vocab_size ({vocab_size})");
    match ids.iter().find(|&&id| id as usize >= vocab_size) {
        Some(bad) => Err(invalid("", want, format!("{ids:?} (id {bad} is out of range)"))),
        None => Ok(ids.to_vec()),
    }
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
        let ple = c.fits("hidden_size_per_layer_input", ple)?;
        // The per-layer input is one [V, layers × P] table, reshaped to [.., layers, P].
        c.product("num_hidden_layers × hidden_size_per_layer_input", n, ple)?;
        let vocab_size_per_layer_input = t.vocab_size_per_layer_input.unwrap_or(VOCAB);
        let vocab_size_per_layer_input = c.fits("vocab_size_per_layer_input", vocab_size_per_layer_input)?;
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
        // The [V, H] embedding table, read by gathers and as the tied head: its element count
        // is bounded by i32 as well, so no flat index into it can wrap.
        c.product("vocab_size × hidden_size", vocab_size, hidden_size)?;
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
            c.product(&format!("num_attention_heads × {dim_field}"), n_heads, dim)?;
            c.product(&format!("{kv_field} × {dim_field}"), n_kv_heads, dim)?;
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
                true => c.product("intermediate_size × 2 (use_double_wide_mlp)", intermediate_size, 2)?,
                false => intermediate_size,
            };
            layers.push(LayerSpec {
                kind,
                head_dim: dim,
                n_kv_heads,
                n_heads,
                rope,
                rotary_dims,
                kv,
                has_v_proj: !(kind == LayerKind::Full && k_eq_v),
                mlp_width,
            });
        }

        let text_quant = nested.as_ref().and_then(|t| t.quantization_config.as_ref());
        let quantization = [
            (top.quantization.as_ref(), "quantization"),
            (top.quantization_config.as_ref(), "quantization_config"),
            (text_quant, "text_config.quantization_config"),
        ];
        let quantization = quantization.into_iter().find_map(|(q, f)| Some(parse_quant(q?, f)));

        // The stop set comes from the top level; text_config's is a fallback.
        let eos = match (&top.eos_token_id, &t.eos_token_id) {
            (Some(ids), _) => Some((ids, "eos_token_id".to_string())),
            (None, Some(ids)) => Some((ids, format!("{}eos_token_id", c.0))),
            (None, None) => None,
        };
        // bos and pad ids are looked up in the embedding: an id past the vocabulary would be
        // an out-of-range gather on the first prompt.
        let special = |field: &str, inner: Option<u32>, outer: Option<u32>, default: u32| {
            let (id, name) = match (inner, outer) {
                (Some(id), _) => (id, format!("{}{field}", c.0)),
                (None, Some(id)) => (id, field.to_string()),
                (None, None) => return Ok(default),
            };
            if id as usize >= vocab_size {
                return Err(invalid(name, format!("a token id below vocab_size ({vocab_size})"), id));
            }
            Ok(id)
        };
        let bos_token_id = special("bos_token_id", t.bos_token_id, top.bos_token_id, 2)?;
        let pad_token_id = special("pad_token_id", t.pad_token_id, top.pad_token_id, 0)?;
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
            max_position_embeddings: c.pos("max_position_embeddings", t.max_position_embeddings, 131_072)?,
            eos_token_ids: match eos {
                Some((ids, field)) => check_eos(ids, vocab_size).map_err(|e| e.in_field(&field))?,
                None => vec![1],
            },
            bos_token_id,
            pad_token_id,
            layers,
            quantization: quantization.transpose()?,
        })
    }
}
