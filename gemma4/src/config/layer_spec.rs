//! Per-layer facts derived once from the config: attention kind, RoPE, K/V source, widths.

use serde::{Deserialize, Serialize};

/// Attention type of one layer; selects head dim, RoPE, mask and cache type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LayerKind {
    /// Sliding-window attention with a rotating cache.
    #[serde(rename = "sliding_attention")]
    Sliding,
    /// Global (full) attention with a growing cache.
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

    pub(crate) fn parse(s: &str) -> Option<Self> {
        [LayerKind::Sliding, LayerKind::Full].into_iter().find(|k| k.as_str() == s)
    }
}

/// The two RoPE variants Gemma 4 uses; mlx-lm's other types never occur here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RopeType {
    /// `nn.RoPE` over the whole head; `partial_rotary_factor` and `factor` are ignored.
    Default,
    /// `ProportionalRoPE`: `rotary_dims` pairs rotate, exponents divide by the full head dim.
    Proportional,
}

impl RopeType {
    /// The `rope_type` string as written in `config.json`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RopeType::Default => "default",
            RopeType::Proportional => "proportional",
        }
    }
}

/// RoPE parameters of one layer kind. f32 because MLX rounds Python floats to f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Which RoPE variant.
    pub rope_type: RopeType,
    /// Base frequency θ.
    pub theta: f32,
    /// Fraction of the head dim that rotates (proportional RoPE only).
    pub partial_rotary_factor: f32,
    /// Frequency scaling factor (proportional RoPE only).
    pub factor: f32,
}

/// Where a layer's K/V come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvSource {
    /// Donor layer with its own projections and cache; `cache_index` in `0..num_caches()`.
    Own {
        /// Index of this layer's cache in the model's cache list.
        cache_index: usize,
    },
    /// KV-shared layer: no k/v weights, no cache; reads `donor`'s fetched K/V and offset.
    Shared {
        /// Index of the donor layer whose K/V this layer reads.
        donor: usize,
    },
}

/// Everything one decoder layer needs, derived once.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSpec {
    /// Sliding or full attention.
    pub kind: LayerKind,
    /// `head_dim` for sliding layers, `global_head_dim` for full ones.
    pub head_dim: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Query heads.
    pub n_heads: usize,
    /// RoPE parameters of this layer's kind.
    pub rope: RopeSpec,
    /// `int(head_dim * partial_rotary_factor)` for proportional RoPE, else `head_dim`.
    pub rotary_dims: usize,
    /// Whether this layer owns its K/V or reads a donor's.
    pub kv: KvSource,
    /// False iff a full layer with `attention_k_eq_v` (V is the raw k_proj output). Shared
    /// layers have no k/v weights at all regardless; see `kv`.
    pub has_v_proj: bool,
    /// `2 × intermediate_size` for shared layers under `use_double_wide_mlp`.
    pub mlp_width: usize,
}

/// Which JSON layout the config used; weight-name prefixes depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `model_type: "gemma4_text"`, fields at top level, weights `model.*`.
    Flat,
    /// `model_type: "gemma4"` / `"gemma4_unified"`, decoder under `text_config`.
    Nested,
}
