//! The MoE branch of 26B-style layers: a router over the un-normed residual and SwitchGLU
//! experts via gather_(q)mm, with mlx-lm's token sort when idx.size ≥ 64. Stepwise forwards
//! call it one row at a time (see `DecoderLayer::moe_by_row`), so they never take the sorted path.

use mlx_core::quant::{gather_mm, gather_qmm};
use mlx_core::Array;

use crate::error::Result;
use crate::linear::Linear;
use crate::weights::{LinearWeights, WeightMap};

#[cfg(feature = "testing")]
thread_local! {
    static SORTED_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many expert calls built on this thread took the sorted path (feature `testing`): lets
/// tests check that stepwise forwards never do, whatever the backend's rounding.
#[cfg(feature = "testing")]
pub fn sorted_expert_calls() -> usize {
    SORTED_CALLS.with(std::cell::Cell::get)
}

/// Router: norm → scale → project → top-k → softmax → per-expert scale.
pub struct Router {
    proj: Linear,
    scale: Array,            // [H]
    per_expert_scale: Array, // [E]
    top_k: i32,
    n_experts: i32,
    root_size: f64,
    eps: f32,
}

impl Router {
    pub fn load(
        wm: &mut WeightMap,
        prefix: &str,
        hidden: usize,
        experts: usize,
        top_k: usize,
        eps: f32,
    ) -> Result<Router> {
        Ok(Router {
            proj: Linear::load(wm, &format!("{prefix}.router.proj"), experts, hidden)?,
            scale: wm.get_shaped(&format!("{prefix}.router.scale"), &[hidden as i32])?,
            per_expert_scale: wm.get_shaped(&format!("{prefix}.router.per_expert_scale"), &[experts as i32])?,
            top_k: top_k as i32,
            n_experts: experts as i32,
            root_size: (hidden as f64).powf(-0.5),
            eps,
        })
    }

    /// h `[B, L, H]` -> (indices `[B, L, k]` in argpartition order, weights `[B, L, k]`)
    pub fn forward(&self, h: &Array) -> Result<(Array, Array)> {
        let w = self.scale.mul_scalar(self.root_size)?;
        let xn = mlx_core::blas::rms_norm(h, Some(&w), self.eps)?;
        let scores = self.proj.forward(&xn)?;
        let part = scores.argpartition(self.n_experts - self.top_k, -1)?;
        let idx = part.slice_axis(-1, self.n_experts - self.top_k, self.n_experts)?;
        let weights = scores.take_along_axis(&idx, -1)?.softmax(&[-1], false)?;
        let weights = weights.multiply(&self.per_expert_scale.take(&idx, 0)?)?;
        Ok((idx, weights))
    }
}

struct SwitchLinear {
    w: LinearWeights, // [E, out, in] dense or quantized
}

impl SwitchLinear {
    fn forward(&self, x: &Array, idx: &Array, sorted: bool) -> Result<Array> {
        Ok(match &self.w {
            LinearWeights::Dense(w) => gather_mm(x, &w.swapaxes(-1, -2)?, idx, sorted)?,
            LinearWeights::Bf16AsF32(w) => {
                gather_mm(x, &w.astype(mlx_core::Dtype::F32)?.swapaxes(-1, -2)?, idx, sorted)?
            }
            LinearWeights::Quantized(q) => gather_qmm(x, q, idx, true, sorted)?,
        })
    }
}

/// SwitchGLU experts.
pub struct Experts {
    gate_proj: SwitchLinear,
    up_proj: SwitchLinear,
    down_proj: SwitchLinear,
}

impl Experts {
    pub fn load(wm: &mut WeightMap, prefix: &str, hidden: usize, width: usize, experts: usize) -> Result<Experts> {
        let p = |n: &str| format!("{prefix}.experts.switch_glu.{n}");
        let e = Some(experts);
        Ok(Experts {
            gate_proj: SwitchLinear { w: wm.stacked_linear(&p("gate_proj"), e, width, hidden)? },
            up_proj: SwitchLinear { w: wm.stacked_linear(&p("up_proj"), e, width, hidden)? },
            down_proj: SwitchLinear { w: wm.stacked_linear(&p("down_proj"), e, hidden, width)? },
        })
    }

    /// x `[B, L, H]`, idx/w `[B, L, k]` -> `[B, L, H]`
    pub fn forward(&self, x: &Array, idx: &Array, weights: &Array) -> Result<Array> {
        let ishape = idx.shape()?;
        let k = *ishape.last().unwrap_or(&1);
        let xs = x.expand_dims(-2)?.expand_dims(-3)?; // [B, L, 1, 1, H]
        let do_sort = idx.size()? >= 64;
        #[cfg(feature = "testing")]
        SORTED_CALLS.with(|c| c.set(c.get() + usize::from(do_sort)));
        let (xs, ids, inv) = if do_sort {
            let flat = idx.reshape(&[-1])?;
            let order = flat.argsort(0)?;
            let inv = order.argsort(0)?;
            let h = xs.dim(-1)?;
            let rows = xs.reshape(&[-1, 1, h])?; // flatten(0, -3): [B·L, 1, H]
            let src = order.floor_divide(&Array::scalar(k as f64, order.dtype())?)?;
            (rows.take(&src, 0)?, flat.take(&order, 0)?, Some(inv))
        } else {
            (xs, idx.clone(), None)
        };
        let up = self.up_proj.forward(&xs, &ids, do_sort)?;
        let gate = self.gate_proj.forward(&xs, &ids, do_sort)?;
        let act = crate::mlp::gelu(&gate)?.multiply(&up)?;
        let mut y = self.down_proj.forward(&act, &ids, do_sort)?;
        if let Some(inv) = inv {
            y = y.take(&inv, 0)?;
            let mut shape = ishape.clone();
            shape.extend(y.shape()?[1..].iter().copied());
            y = y.reshape(&shape)?;
        }
        let y = y.squeeze(-2)?; // [B, L, k, H]
        let w = weights.expand_dims(-1)?;
        Ok(w.multiply(&y)?.sum(&[-2], false)?)
    }
}
