//! Gemma-4 attention (gemma4.md §3.5): q/k norms instead of 1/√d (scale 1.0), V normed without
//! weight and not roped, GQA in the kernel, and KV sharing: a shared layer reads its donor's
//! fetched K/V and the donor's pre-write offset.

use mlx_core::{fast, Array};

use crate::cache::LayerCache;
use crate::config::{KvSource, LayerSpec};
use crate::error::Result;
use crate::linear::Linear;
use crate::mask::AttnMask;
use crate::rope::Rope;
use crate::weights::WeightMap;

/// K/V (and RoPE offset) a donor publishes to its sharers.
#[derive(Clone, Debug)]
pub struct SharedKv {
    pub keys: Array,   // [B, Hkv, S, D]
    pub values: Array, // [B, Hkv, S, D]
    pub offset: i32,
}

struct KvProj {
    k_proj: Linear,
    v_proj: Option<Linear>, // None when V = raw k_proj output (k_eq_v)
    k_norm: Array,
}

/// One attention block.
pub struct Attention {
    q_proj: Linear,
    o_proj: Linear,
    q_norm: Array,
    kv: Option<KvProj>,
    rope: Rope,
    n_heads: i32,
    n_kv_heads: i32,
    head_dim: i32,
    eps: f32,
}

impl Attention {
    /// Loads `prefix.self_attn.*`.
    pub fn load(wm: &mut WeightMap, prefix: &str, spec: &LayerSpec, hidden: usize, eps: f32) -> Result<Attention> {
        let p = |n: &str| format!("{prefix}.self_attn.{n}");
        let (hq, hkv, d) = (spec.n_heads, spec.n_kv_heads, spec.head_dim);
        let q_proj = Linear::load(wm, &p("q_proj"), hq * d, hidden)?;
        let o_proj = Linear::load(wm, &p("o_proj"), hidden, hq * d)?;
        let q_norm = wm.get_shaped(&p("q_norm.weight"), &[d as i32])?;
        let kv = match spec.kv {
            KvSource::Own { .. } => Some(KvProj {
                k_proj: Linear::load(wm, &p("k_proj"), hkv * d, hidden)?,
                v_proj: if spec.has_v_proj { Some(Linear::load(wm, &p("v_proj"), hkv * d, hidden)?) } else { None },
                k_norm: wm.get_shaped(&p("k_norm.weight"), &[d as i32])?,
            }),
            KvSource::Shared { .. } => None,
        };
        Ok(Attention {
            q_proj,
            o_proj,
            q_norm,
            kv,
            rope: Rope::new(&spec.rope, d, spec.rotary_dims)?,
            n_heads: hq as i32,
            n_kv_heads: hkv as i32,
            head_dim: d as i32,
            eps,
        })
    }

    /// x [B, L, H] -> ([B, L, H], the K/V this layer attended to).
    pub fn forward(
        &self,
        x: &Array,
        mask: &AttnMask,
        cache: Option<&mut LayerCache>,
        shared: Option<&SharedKv>,
    ) -> Result<(Array, SharedKv)> {
        let shape = x.shape();
        let (b, l) = (shape[0], shape[1]);
        let q = self.q_proj.forward(x)?.reshape(&[b, l, self.n_heads, self.head_dim])?;
        let q = fast::rms_norm(&q, Some(&self.q_norm), self.eps)?;
        let (keys, values, offset) = match (&self.kv, shared) {
            (_, Some(s)) => (s.keys.clone(), s.values.clone(), s.offset),
            (Some(kv), None) => {
                let k = kv.k_proj.forward(x)?.reshape(&[b, l, self.n_kv_heads, self.head_dim])?;
                let v = match &kv.v_proj {
                    Some(v_proj) => v_proj.forward(x)?.reshape(&[b, l, self.n_kv_heads, self.head_dim])?,
                    None => k.clone(),
                };
                let offset = cache.as_ref().map(|c| c.offset() as i32).unwrap_or(0);
                let k = fast::rms_norm(&k, Some(&kv.k_norm), self.eps)?.transpose(&[0, 2, 1, 3])?; // [B, Hkv, L, D]
                let k = self.rope.apply(&k, offset)?;
                let v = fast::rms_norm(&v, None, self.eps)?.transpose(&[0, 2, 1, 3])?;
                (k, v, offset)
            }
            (None, None) => {
                return Err(crate::Error::Input { op: "attention", detail: "KV-shared layer received no donor K/V".into() })
            }
        };
        let q = q.transpose(&[0, 2, 1, 3])?; // [B, Hq, L, D]
        let q = self.rope.apply(&q, offset)?;
        let (keys, values) = match (cache, shared) {
            (Some(c), None) => c.update_and_fetch(&keys, &values)?,
            _ => (keys, values),
        };
        let o = fast::scaled_dot_product_attention(&q, &keys, &values, 1.0, mask.as_fast())?;
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?;
        Ok((self.o_proj.forward(&o)?, SharedKv { keys, values, offset }))
    }
}
