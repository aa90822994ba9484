//! The DeepSpec backbone: weights (docs/formats.md, "DeepSpec drafters") and the stateless
//! forward pieces (docs/numerics.md, "DeepSpec drafter numerics").
//!
//! Numerics mirror gemma4 (and so mlx-lm / HF Gemma4): `fast::rms_norm` (null weight = the
//! scale-less v_norm), weak scalars in the model dtype, `gelu_approx` with `power(x, 3)`,
//! proportional RoPE wavelengths θ^(2k/head_dim) computed with MLX ops (full head_dim divisor,
//! +∞ = identity for the unrotated pairs), SDPA scale 1.0 with no mask, `h · layer_scalar` on
//! the whole layer output. K ≡ V: V is the **raw** k_proj output through a weightless RMSNorm,
//! never roped. Linear weights stay HF `[out, in]` and are used as `x @ Wᵀ` through a
//! transpose view (or `quantized_matmul(transpose = true)`): no contiguous copies.

use gemma4::config::{RopeSpec, RopeType};
use gemma4::linear::{Embedding, Linear};
use gemma4::rope::Rope;
use gemma4::weights::WeightMap;
use mlx_core::fast::{self, Mask};
use mlx_core::{gelu_approx, Array, Dtype};

use super::config::{DeepSpecConfig, RopeKind};
use super::context::ContextKv;
use crate::drafters::context_cache::LayerKv;
use crate::error::Result;

struct Layer {
    q_proj: Linear,
    k_proj: Linear,
    o_proj: Linear,
    q_norm: Array,
    k_norm: Array,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    input_layernorm: Array,
    post_attention_layernorm: Array,
    pre_feedforward_layernorm: Array,
    post_feedforward_layernorm: Array,
    layer_scalar: Array,
}

/// The Markov head: `markov_w1` `[V, r]` gather table, `markov_w2` `[V, r]` linear.
pub(crate) struct Markov {
    pub(crate) w1: Embedding,
    pub(crate) w2: Linear,
}

/// `confidence_head.proj` `[1, in]` + bias `[1]`.
pub(crate) struct Confidence {
    pub(crate) proj: Linear,
    pub(crate) bias: Array,
}

/// DeepSpec weights (stateless; per-request context K/V live in `context.rs`).
pub(crate) struct DeepSpecModel {
    pub(crate) cfg: DeepSpecConfig,
    embed_tokens: Embedding,
    fc: Linear,
    hidden_norm: Array,
    layers: Vec<Layer>,
    norm: Array,
    lm_head: Linear,
    pub(crate) markov: Option<Markov>,
    pub(crate) confidence: Option<Confidence>,
    rope: Rope,
    /// The activation dtype (of `norm.weight`, bf16 in released checkpoints).
    pub(crate) dtype: Dtype,
}

impl DeepSpecModel {
    /// Takes every checkpoint tensor (docs/formats.md, "DeepSpec drafters") from `wm`, shapes
    /// checked against `cfg`.
    pub(crate) fn from_weights(cfg: DeepSpecConfig, wm: &mut WeightMap) -> Result<DeepSpecModel> {
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let (nh, nkv, hd, inter) = (cfg.num_attention_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size);
        let vec = |wm: &mut WeightMap, name: &str, d: usize| wm.get_shaped(name, &[d as i32]);
        let embed_tokens = Embedding::load(wm, "embed_tokens", v, h)?;
        let fc = Linear::load(wm, "fc", h, cfg.context_width())?;
        let hidden_norm = vec(wm, "hidden_norm.weight", h)?;
        let norm = vec(wm, "norm.weight", h)?;
        let lm_head = Linear::load(wm, "lm_head", v, h)?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let p = |n: &str| format!("layers.{i}.{n}");
            layers.push(Layer {
                q_proj: Linear::load(wm, &p("self_attn.q_proj"), nh * hd, h)?,
                k_proj: Linear::load(wm, &p("self_attn.k_proj"), nkv * hd, h)?,
                o_proj: Linear::load(wm, &p("self_attn.o_proj"), h, nh * hd)?,
                q_norm: vec(wm, &p("self_attn.q_norm.weight"), hd)?,
                k_norm: vec(wm, &p("self_attn.k_norm.weight"), hd)?,
                gate_proj: Linear::load(wm, &p("mlp.gate_proj"), inter, h)?,
                up_proj: Linear::load(wm, &p("mlp.up_proj"), inter, h)?,
                down_proj: Linear::load(wm, &p("mlp.down_proj"), h, inter)?,
                input_layernorm: vec(wm, &p("input_layernorm.weight"), h)?,
                post_attention_layernorm: vec(wm, &p("post_attention_layernorm.weight"), h)?,
                pre_feedforward_layernorm: vec(wm, &p("pre_feedforward_layernorm.weight"), h)?,
                post_feedforward_layernorm: vec(wm, &p("post_feedforward_layernorm.weight"), h)?,
                layer_scalar: vec(wm, &p("layer_scalar"), 1)?,
            });
        }
        let markov = if cfg.markov_rank > 0 {
            Some(Markov {
                w1: Embedding::load(wm, "markov_head.markov_w1", v, cfg.markov_rank)?,
                w2: Linear::load(wm, "markov_head.markov_w2", v, cfg.markov_rank)?,
            })
        } else {
            None
        };
        let confidence = if cfg.enable_confidence_head {
            Some(Confidence {
                proj: Linear::load(wm, "confidence_head.proj", 1, cfg.confidence_width())?,
                bias: vec(wm, "confidence_head.proj.bias", 1)?,
            })
        } else {
            None
        };
        let dtype = norm.dtype();
        let rope = deepspec_rope(&cfg)?;
        Ok(DeepSpecModel { cfg, embed_tokens, fc, hidden_norm, layers, norm, lm_head, markov, confidence, rope, dtype })
    }

    fn rms(&self, x: &Array, w: Option<&Array>) -> Result<Array> {
        Ok(mlx_core::blas::rms_norm(x, w, self.cfg.rms_norm_eps)?)
    }

    /// `hidden_norm(fc(rows))` // `[1, L, taps·H]` -> `[1, L, H]`
    pub(crate) fn project_context(&self, rows: &Array) -> Result<Array> {
        let x = rows.astype(self.dtype)?;
        self.rms(&self.fc.forward(&x)?, Some(&self.hidden_norm))
    }

    /// Per-layer context K/V of projected rows at positions start..start+L // `[1, L, H]`
    pub(crate) fn context_kv(&self, ctx: &Array, start: usize) -> Result<Vec<LayerKv>> {
        self.layers.iter().map(|l| self.noise_kv(l, ctx, start)).collect()
    }

    /// K (k_norm, roped) and V (weightless norm of the raw projection) // `[B, L, H]` -> `[B, nKv, L, hd]`
    fn noise_kv(&self, l: &Layer, x: &Array, start: usize) -> Result<LayerKv> {
        let s = x.shape()?;
        let raw =
            l.k_proj.forward(x)?.reshape(&[s[0], s[1], self.cfg.num_kv_heads as i32, self.cfg.head_dim as i32])?;
        let v = self.rms(&raw, None)?.transpose(&[0, 2, 1, 3])?;
        let k = self.rms(&raw, Some(&l.k_norm))?.transpose(&[0, 2, 1, 3])?;
        Ok(LayerKv { k: self.rope.apply(&k, start as i32)?, v })
    }

    /// Post-norm hidden of the block rows // ids `[1, γ]`, context per layer -> `[1, γ, H]`
    pub(crate) fn backbone(&self, ids: &Array, ctx: &mut ContextKv, position: usize) -> Result<Array> {
        let (nh, hd) = (self.cfg.num_attention_heads as i32, self.cfg.head_dim as i32);
        let mut h = self.embed_tokens.forward(ids)?.mul_scalar((self.cfg.hidden_size as f64).sqrt())?; // [1, γ, H]
        let s = h.shape()?;
        let (b, l) = (s[0], s[1]);
        for (i, layer) in self.layers.iter().enumerate() {
            let x = self.rms(&h, Some(&layer.input_layernorm))?;
            let q = layer.q_proj.forward(&x)?.reshape(&[b, l, nh, hd])?;
            let q = self.rms(&q, Some(&layer.q_norm))?.transpose(&[0, 2, 1, 3])?; // [1, nH, γ, hd]
            let q = self.rope.apply(&q, position as i32)?;
            let noise = self.noise_kv(layer, &x, position)?;
            let (k, v) = ctx.with_block(i, &noise)?; // [1, nKv, L+γ, hd]
            let o = fast::scaled_dot_product_attention(&q, &k, &v, 1.0, Mask::None)?;
            let o = layer.o_proj.forward(&o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)?;
            let h1 = h.add(&self.rms(&o, Some(&layer.post_attention_layernorm))?)?;
            let f = self.rms(&h1, Some(&layer.pre_feedforward_layernorm))?;
            let m = gelu_approx(&layer.gate_proj.forward(&f)?)?.multiply(&layer.up_proj.forward(&f)?)?;
            let m = layer.down_proj.forward(&m)?;
            let h2 = h1.add(&self.rms(&m, Some(&layer.post_feedforward_layernorm))?)?;
            h = h2.multiply(&layer.layer_scalar)?;
        }
        self.rms(&h, Some(&self.norm))
    }

    /// `lm_head(h)` then softcap, in the model dtype // `[.., H]` -> `[.., V]`
    pub(crate) fn logits(&self, h: &Array) -> Result<Array> {
        let x = self.lm_head.forward(h)?;
        Ok(match self.cfg.final_logit_softcapping {
            Some(c) => x.div_scalar(c as f64)?.tanh()?.mul_scalar(c as f64)?,
            None => x,
        })
    }
}

/// gemma4's RoPE with the DeepSpec config's parameters: proportional wavelengths θ^(2k/hd) over
/// the rotated pairs (full head_dim divisor, factor 1) and +∞ (identity) for the rest.
fn deepspec_rope(cfg: &DeepSpecConfig) -> Result<Rope> {
    let (rope_type, partial) = match cfg.rope {
        RopeKind::Default => (RopeType::Default, 1.0),
        RopeKind::Proportional { partial_rotary_factor } => (RopeType::Proportional, partial_rotary_factor as f32),
    };
    let spec = RopeSpec { rope_type, theta: cfg.rope_theta, partial_rotary_factor: partial, factor: 1.0 };
    Ok(Rope::new(&spec, cfg.head_dim, 2 * cfg.rotated_pairs())?)
}
