//! One decoder layer: attention and FFN sandwiches of RMSNorms, optional MoE
//! branch, optional per-layer-embedding gate, then `h · layer_scalar`.

use mlx_core::{concatenate, Array};

use crate::attention::{Attend, Attention, AttnInput, SharedKv};
use crate::cache::LayerCache;
use crate::config::{LayerSpec, TextConfig};
use crate::error::{Error, Result};
use crate::linear::Linear;
use crate::mlp::Mlp;
use crate::moe::{Experts, Router};
use crate::weights::WeightMap;

struct Moe {
    router: Router,
    experts: Experts,
    post_feedforward_layernorm_1: Array,
    post_feedforward_layernorm_2: Array,
    pre_feedforward_layernorm_2: Array,
}

struct PleGate {
    per_layer_input_gate: Linear,
    per_layer_projection: Linear,
    post_per_layer_input_norm: Array,
}

/// A decoder layer.
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: Array,
    post_attention_layernorm: Array,
    pre_feedforward_layernorm: Array,
    post_feedforward_layernorm: Array,
    moe: Option<Moe>,
    ple: Option<PleGate>,
    layer_scalar: Array,
    eps: f32,
}

impl DecoderLayer {
    /// Loads `layers.{i}.*`.
    pub fn load(wm: &mut WeightMap, cfg: &TextConfig, i: usize, spec: &LayerSpec) -> Result<DecoderLayer> {
        let prefix = format!("layers.{i}");
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        let norm = |wm: &mut WeightMap, n: &str, d: usize| wm.get_shaped(&format!("{prefix}.{n}.weight"), &[d as i32]);
        let moe = if cfg.enable_moe_block {
            let (Some(e), Some(k), Some(w)) = (cfg.num_experts, cfg.top_k_experts, cfg.moe_intermediate_size) else {
                return Err(Error::Unsupported {
                    feature: "MoE",
                    detail: "config lacks num_experts/top_k_experts/moe_intermediate_size".into(),
                });
            };
            Some(Moe {
                router: Router::load(wm, &prefix, h, e, k, eps)?,
                experts: Experts::load(wm, &prefix, h, w, e)?,
                post_feedforward_layernorm_1: norm(wm, "post_feedforward_layernorm_1", h)?,
                post_feedforward_layernorm_2: norm(wm, "post_feedforward_layernorm_2", h)?,
                pre_feedforward_layernorm_2: norm(wm, "pre_feedforward_layernorm_2", h)?,
            })
        } else {
            None
        };
        let ple = if cfg.has_ple() {
            let p = cfg.hidden_size_per_layer_input;
            Some(PleGate {
                per_layer_input_gate: Linear::load(wm, &format!("{prefix}.per_layer_input_gate"), p, h)?,
                per_layer_projection: Linear::load(wm, &format!("{prefix}.per_layer_projection"), h, p)?,
                post_per_layer_input_norm: norm(wm, "post_per_layer_input_norm", h)?,
            })
        } else {
            None
        };
        Ok(DecoderLayer {
            self_attn: Attention::load(wm, &prefix, spec, h, eps)?,
            mlp: Mlp::load(wm, &format!("{prefix}.mlp"), h, spec.mlp_width)?,
            input_layernorm: norm(wm, "input_layernorm", h)?,
            post_attention_layernorm: norm(wm, "post_attention_layernorm", h)?,
            pre_feedforward_layernorm: norm(wm, "pre_feedforward_layernorm", h)?,
            post_feedforward_layernorm: norm(wm, "post_feedforward_layernorm", h)?,
            moe,
            ple,
            layer_scalar: wm.get_shaped(&format!("{prefix}.layer_scalar"), &[1])?,
            eps,
        })
    }

    /// The hidden width of `x` // `[.., H]` -> H
    fn hidden_width(&self, x: &Array) -> Result<usize> {
        Ok(x.shape()?.last().map_or(1, |&h| h.max(1) as usize))
    }

    /// The weights of the fused tail (`mlx_core::row_layer::ffn`) when this layer is dense with
    /// matrices the row nodes read (f32, bf16, 8/4-bit packed) and no MoE; a per-layer-input
    /// branch rides along with `per_layer_input` (its rows flattened, `[R, P]`).
    fn fused_tail_weights<'a>(
        &'a self,
        per_layer_input: Option<&'a Array>,
    ) -> Option<mlx_core::row_layer::FfnWeights<'a>> {
        if self.moe.is_some() {
            return None;
        }
        let [w_gate, w_up, w_down] = self.mlp.row_weights()?;
        let vectors = [
            &self.post_attention_layernorm,
            &self.pre_feedforward_layernorm,
            &self.post_feedforward_layernorm,
            &self.layer_scalar,
        ];
        if vectors.iter().any(|v| v.dtype() != mlx_core::Dtype::F32) {
            return None;
        }
        let per_layer = match (&self.ple, per_layer_input) {
            (None, _) => None,
            (Some(_), None) => return None,
            (Some(g), Some(input)) => {
                if g.post_per_layer_input_norm.dtype() != mlx_core::Dtype::F32 {
                    return None;
                }
                Some(mlx_core::row_layer::PerLayerTail {
                    input,
                    gate: g.per_layer_input_gate.row_weight()?,
                    projection: g.per_layer_projection.row_weight()?,
                    post_norm: &g.post_per_layer_input_norm,
                })
            }
        };
        Some(mlx_core::row_layer::FfnWeights {
            wo: self.self_attn.o_proj_row()?,
            post_attention_norm: &self.post_attention_layernorm,
            pre_feedforward_norm: &self.pre_feedforward_layernorm,
            w_gate,
            w_up,
            w_down,
            post_feedforward_norm: &self.post_feedforward_layernorm,
            layer_scalar: &self.layer_scalar,
            per_layer,
        })
    }

    fn norm(&self, x: &Array, w: &Array) -> Result<Array> {
        Ok(mlx_core::blas::rms_norm(x, Some(w), self.eps)?)
    }

    /// The expert branch before its post-norm // h `[B, L, H]` -> `[B, L, H]`
    fn moe(&self, m: &Moe, h: &Array) -> Result<Array> {
        let (idx, w) = m.router.forward(h)?; // the router reads the un-normed residual
        m.experts.forward(&self.norm(h, &m.pre_feedforward_layernorm_2)?, &idx, &w)
    }

    /// [`Self::moe`] one position at a time, for stepwise forwards: the expert kernels pick
    /// their path by the number of (token, expert) pairs (sorted at >= 64), so a batch of rows
    /// could round differently from the one-token decode step each row must reproduce.
    fn moe_by_row(&self, m: &Moe, h: &Array) -> Result<Array> {
        let l = h.dim(1)?;
        if l == 1 {
            return self.moe(m, h);
        }
        let rows = (0..l).map(|i| self.moe(m, &h.slice_axis(1, i, i + 1)?)).collect::<Result<Vec<_>>>()?;
        Ok(concatenate(&rows, 1)?)
    }

    /// x `[B, L, H]` -> (`[B, L − rows_from, H]`, K/V for sharers): every row's K/V is
    /// computed (and cached), the rest of the layer runs for the rows from `rows_from` on
    /// (`per_layer_input` holds just those rows). `caches`: none, or one per segment.
    pub fn forward(
        &self,
        x: &Array,
        attend: Attend<'_>,
        caches: Vec<&mut LayerCache>,
        per_layer_input: Option<&Array>,
        shared: Option<&SharedKv>,
        rows_from: i32,
    ) -> Result<(Array, SharedKv)> {
        let stepwise = matches!(attend, Attend::Stepwise(_));
        // Few f32 rows on the CPU (decode steps, verify windows): the layer's chains as fused
        // row nodes, each row's bits its own, so decode steps and verify rows still agree.
        let rows = x.size()? / (self.hidden_width(x)?);
        let fused =
            rows_from == 0 && rows <= mlx_core::blas::ROW_LINEAR_MAX_ROWS && mlx_core::blas::row_kernels_for(x)?;
        let normed;
        // A KV-shared layer projects only q (its K/V come from `shared`): composed; its tail fuses.
        let input = match fused && shared.is_none() && self.self_attn.fusable(&self.input_layernorm) {
            true => AttnInput::Fused { x, input_norm: &self.input_layernorm },
            false => {
                normed = self.norm(x, &self.input_layernorm)?;
                AttnInput::Normed(&normed)
            }
        };
        let flat = |t: &Array| t.reshape(&[rows as i32, -1]);
        let pli = match (fused, per_layer_input) {
            (true, Some(p)) => Some(flat(p)?), // [R, P]
            _ => None,
        };
        if let Some(w) = self.fused_tail_weights(pli.as_ref()).filter(|_| fused) {
            let (a, kv) = self.self_attn.forward_heads(input, attend, caches, shared, 0)?; // [B, L, Hq·D]
            let shape = x.shape()?; // [B, L, H]
            let out = mlx_core::row_layer::ffn(&flat(&a)?, &flat(x)?, &w, self.eps)?;
            return Ok((out.reshape(&shape)?, kv));
        }
        let (a, kv) = self.self_attn.forward(input, attend, caches, shared, rows_from)?;
        let x = if rows_from > 0 { x.slice_axis(1, rows_from, x.dim(1)?)? } else { x.clone() };
        let h = x.add(&self.norm(&a, &self.post_attention_layernorm)?)?;
        let f = match &self.moe {
            Some(m) => {
                let h1 = self.mlp.forward(&self.norm(&h, &self.pre_feedforward_layernorm)?)?;
                let h1 = self.norm(&h1, &m.post_feedforward_layernorm_1)?;
                let h2 = match stepwise {
                    true => self.moe_by_row(m, &h)?,
                    false => self.moe(m, &h)?,
                };
                let h2 = self.norm(&h2, &m.post_feedforward_layernorm_2)?;
                h1.add(&h2)?
            }
            None => self.mlp.forward(&self.norm(&h, &self.pre_feedforward_layernorm)?)?,
        };
        let mut h = h.add(&self.norm(&f, &self.post_feedforward_layernorm)?)?;
        if let (Some(g), Some(pli)) = (&self.ple, per_layer_input) {
            let gate = crate::mlp::gelu(&g.per_layer_input_gate.forward(&h)?)?.multiply(pli)?;
            let gate = self.norm(&g.per_layer_projection.forward(&gate)?, &g.post_per_layer_input_norm)?;
            h = h.add(&gate)?;
        }
        Ok((h.multiply(&self.layer_scalar)?, kv))
    }
}
