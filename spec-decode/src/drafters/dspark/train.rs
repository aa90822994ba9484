//! The DSpark drafter as a differentiable function of its parameters: a batched, teacher-forced
//! forward over A anchors and the training loss.
//!
//! Alignment (the two places drafters are commonly trained wrong):
//! - the context of an anchor at position g is the tapped rows *strictly before* g, as at
//!   inference, where the anchor's own row exists only after the next verify;
//! - block position k predicts x_{g+1+k}, so its target law p^t_k comes from the target's
//!   final-norm hidden at position g+k (the hidden that predicts that token), sent through the
//!   frozen LM head.
//!
//! Loss, per anchor, summed over block positions with weights w_k = exp(−k/γ) and averaged
//! over anchors: 0.1·CE(p^d_k, x*_k) + 0.9·‖p^d_k − p^t_k‖₁ + 1.0·BCE(c_k, c*_k), where
//! c*_k = 1 − ½‖p^d_k − p^t_k‖₁ under stop-gradient is the probability that draft k is accepted.
//! A drafter with a greedy head adds 1.0·BCE(c^g_k, [argmax p^d_k = argmax p^t_k]).
//! The weights follow the paper (decay over the block length γ); a fixed exp(−k/4) would weigh
//! late positions of a long block far less than the paper does.

use std::collections::BTreeMap;

use gemma4::Model;
use mlx_core::{concatenate, fast, gelu_approx, Array, Dtype};

use super::confidence;
use super::config::{DSparkConfig, Dims};
use super::model::Weights;
use crate::error::{Error, Result};

/// One training batch of A anchors, context capped at C rows.
#[derive(Clone, Debug)]
pub struct TrainBatch {
    /// Tapped rows before each anchor, left-padded // `[A, C, m·H]`
    pub ctx_rows: Array,
    /// Which context rows are real (true) or padding // `[A, C]` bool
    pub ctx_mask: Array,
    /// The anchor tokens // `[A]` uint32
    pub anchors: Array,
    /// The tokens after each anchor, x*_0..x*_{γ−1} // `[A, γ]` uint32
    pub block: Array,
    /// The target's final-norm hidden at positions g..g+γ−1 // `[A, γ, H]`
    pub target_hidden: Array,
}

/// Weights of the loss terms.
#[derive(Clone, Debug, PartialEq)]
pub struct LossWeights {
    /// Weight of the cross-entropy against the true next tokens (default 0.1).
    pub ce: f64,
    /// Weight of the L1 distance ‖p^d_k − p^t_k‖₁ to the target's law (default 0.9).
    pub tv: f64,
    /// Weight of the confidence head's BCE against c*_k, the analytic acceptance (default 1.0).
    pub bce: f64,
    /// The greedy head's BCE (drafters with `greedyHead` only).
    pub bce_greedy: f64,
}

impl Default for LossWeights {
    fn default() -> Self {
        LossWeights { ce: 0.1, tv: 0.9, bce: 1.0, bce_greedy: 1.0 }
    }
}

/// The loss and what to log about it (all 0-d f32 arrays, lazy, except where noted).
#[derive(Clone, Debug)]
pub struct LossTerms {
    /// The weighted sum the optimizer minimises.
    pub total: Array,
    /// Cross-entropy term, position-weighted by exp(−k/γ) and averaged over anchors.
    pub ce: Array,
    /// L1 (2 × total-variation) term, weighted the same way.
    pub tv: Array,
    /// Confidence BCE term, weighted the same way.
    pub bce: Array,
    /// The greedy head's BCE against greedy acceptance (0 without the head).
    pub bce_greedy: Array,
    /// Mean analytic acceptance a_k = 1 − ½‖p^d_k − p^t_k‖₁ per block position // `[γ]`
    pub acceptance: Array,
    /// Mean analytic τ = 1 + Σ_j Π_{i≤j} a_i over the batch.
    pub tau: Array,
    /// Mean greedy τ = 1 + Σ_j Π_{i≤j} [argmax p^d_i = argmax p^t_i] over the batch: the
    /// accepted length of greedy decoding where the text is the target's own greedy output.
    pub greedy_tau: Array,
}

/// Draft logits and confidences of a batch.
pub struct TrainForward {
    /// `[A, γ, V]` f32
    pub logits: Array,
    /// `[A, γ]` f32, in (0, 1)
    pub confidence: Array,
    /// The greedy head's confidences (`greedyHead`) // `[A, γ]` f32
    pub greedy_confidence: Option<Array>,
}

fn rms(x: &Array, w: &Array, eps: f32) -> Result<Array> {
    Ok(fast::rms_norm(x, Some(w), eps)?)
}

/// `[A, L, D]` -> `[A, heads, L, hd]`
fn heads(x: &Array, n_heads: usize) -> Result<Array> {
    let s = x.shape()?;
    let (a, l, d) = (s[0], s[1], s[2]);
    Ok(x.reshape(&[a, l, n_heads as i32, d / n_heads as i32])?.transpose(&[0, 2, 1, 3])?)
}

/// The parameters as a name → array map, in `DSparkConfig::param_names` order.
pub fn named_params(cfg: &DSparkConfig, params: &[Array]) -> Result<BTreeMap<String, Array>> {
    let names = cfg.param_names();
    if names.len() != params.len() {
        return Err(Error::Contract(format!("{} parameters given, the config has {}", params.len(), names.len())));
    }
    Ok(names.into_iter().zip(params.iter().cloned()).collect())
}

/// The teacher-forced forward of a batch from parameters `params` (dense, in
/// `DSparkConfig::param_names` order); gradients flow to every parameter, none to the target.
pub fn forward_train(
    cfg: &DSparkConfig,
    dims: &Dims,
    params: &[Array],
    target: &Model,
    batch: &TrainBatch,
) -> Result<TrainForward> {
    let w = Weights::build(cfg, &named_params(cfg, params)?, &BTreeMap::new())?;
    let (g, eps, nh) = (cfg.gamma as i32, dims.eps, cfg.n_heads);
    let shape = batch.block.shape()?;
    if shape.len() != 2 || shape[1] != g {
        return Err(Error::Contract(format!("block is {shape:?}, expected [A, γ = {g}]")));
    }
    let a = shape[0];
    // Context K/V of every layer (per-row ops, so padding rows do not disturb real ones).
    let x = w.w_c.matmul_t(&batch.ctx_rows.astype(Dtype::F32)?)?;
    let hctx = rms(&x, &w.ctx_norm, eps)?; // [A, C, D]

    // The block: anchor row, then γ−1 mask slots.
    let emb = target.embed_raw(&batch.anchors.reshape(&[a, 1])?)?.astype(Dtype::F32)?; // [A, 1, H]
    let row0 = w.tok_proj.matmul_t(&emb)?.add(&w.block_pos.slice_axis(0, 0, 1)?)?; // [A, 1, D]
    let mut h = if g > 1 {
        let masks = w.mask_emb.add(&w.block_pos.slice_axis(0, 1, g)?)?.expand_dims(0)?; // [1, γ−1, D]
        let d = cfg.d_draft as i32;
        concatenate(&[&row0, &masks.broadcast_to(&[a, g - 1, d])?], 1)?
    } else {
        row0
    }; // [A, γ, D]
       // Queries see every real context row and the whole block (bidirectional).
    let block_ok = Array::full(&[a, g], 1.0, Dtype::Bool)?;
    let mask = concatenate(&[&batch.ctx_mask.astype(Dtype::Bool)?, &block_ok], 1)?.reshape(&[a, 1, 1, -1])?;
    let scale = ((cfg.d_draft / cfg.n_heads) as f32).powf(-0.5);
    for l in &w.layers {
        let nc = rms(&hctx, &l.attn_norm, eps)?;
        let (ck, cv) = (heads(&l.k.matmul_t(&nc)?, nh)?, heads(&l.v.matmul_t(&nc)?, nh)?);
        let nd = rms(&h, &l.attn_norm, eps)?;
        let q = heads(&l.q.matmul_t(&nd)?, nh)?;
        let k = concatenate(&[&ck, &heads(&l.k.matmul_t(&nd)?, nh)?], 2)?;
        let v = concatenate(&[&cv, &heads(&l.v.matmul_t(&nd)?, nh)?], 2)?;
        let att = fast::scaled_dot_product_attention(&q, &k, &v, scale, fast::Mask::Array(&mask))?;
        h = h.add(&l.o.matmul_t(&att.transpose(&[0, 2, 1, 3])?.reshape(&[a, g, -1])?)?)?;
        let f = rms(&h, &l.ff_norm, eps)?;
        h = h.add(&l.down.matmul_t(&gelu_approx(&l.gate.matmul_t(&f)?)?.multiply(&l.up.matmul_t(&f)?)?)?)?;
    }
    let h = rms(&h, &w.out_norm, eps)?; // [A, γ, D]
    let u = target.logits_from_hidden(&w.out_proj.matmul_t(&h)?.astype(target.dtype())?)?.astype(Dtype::F32)?;
    // Teacher-forced Markov inputs: the anchor, then the true block tokens.
    let prev = if g > 1 {
        concatenate(&[&batch.anchors.reshape(&[a, 1])?, &batch.block.slice_axis(1, 0, g - 1)?], 1)?
    } else {
        batch.anchors.reshape(&[a, 1])?
    }; // [A, γ]
    let e1 = w.markov_w1.gather(&prev)?.astype(Dtype::F32)?; // [A, γ, r]
    let logits = u.add(&w.markov_w2.matmul_t(&e1)?.astype(Dtype::F32)?)?; // [A, γ, V]

    // The heads read the draft law but do not shape it; the greedy head reads the backbone
    // without shaping it either, so adding it leaves what the drafter drafts as it was.
    let x = confidence::inputs(&h, &e1, &logits.stop_gradient()?, cfg.conf_law)?; // [A, γ, I]
    let conf = confidence::head(&x, &w.conf_w, &w.conf_b)?;
    let greedy_confidence = match &w.conf_greedy {
        Some((gw, gb)) => Some(confidence::head(&x.stop_gradient()?, gw, gb)?),
        None => None,
    };
    Ok(TrainForward { logits, confidence: conf, greedy_confidence })
}

/// The training loss of a forward against the batch's targets.
pub fn dspark_loss(fwd: &TrainForward, target: &Model, batch: &TrainBatch, weights: &LossWeights) -> Result<LossTerms> {
    let (a, g) = {
        let s = fwd.logits.shape()?;
        (s[0], s[1])
    };
    let log_pd = fwd.logits.subtract(&fwd.logits.logsumexp(&[-1], true)?)?; // [A, γ, V]
    let pd = log_pd.exp()?;
    // p^t through the frozen head: a constant of the step.
    let pt =
        target.logits_from_hidden(&batch.target_hidden)?.astype(Dtype::F32)?.softmax(&[-1], true)?.stop_gradient()?;
    let ce = log_pd.take_along_axis(&batch.block.reshape(&[a, g, 1])?, -1)?.squeeze(-1)?.negative()?; // [A, γ]
    let l1 = pd.subtract(&pt)?.abs()?.sum(&[-1], false)?; // [A, γ]
    let c_star = l1.mul_scalar(0.5)?.rsub_scalar(1.0)?.stop_gradient()?;
    let bce = binary_cross_entropy(&fwd.confidence, &c_star)?;
    // Greedy acceptance: the draft's argmax is the target's (ties go to the lower id in both).
    let hit = fwd.logits.argmax(-1, false)?.equal(&pt.argmax(-1, false)?)?.astype(Dtype::F32)?; // [A, γ]
    let bce_greedy = match &fwd.greedy_confidence {
        Some(c) => Some(binary_cross_entropy(c, &hit)?),
        None => None,
    };
    let pos: Vec<f32> = (0..g).map(|k| (-(k as f32) / g as f32).exp()).collect();
    let wk = Array::from_slice(&pos, &[1, g])?;
    let reduce = |x: &Array| -> Result<Array> { Ok(x.multiply(&wk)?.sum(&[1], false)?.mean_all()?) };
    let (ce, tv, bce) = (reduce(&ce)?, reduce(&l1)?, reduce(&bce)?);
    let mut total = ce.mul_scalar(weights.ce)?.add(&tv.mul_scalar(weights.tv)?)?.add(&bce.mul_scalar(weights.bce)?)?;
    let bce_greedy = match bce_greedy {
        Some(b) => {
            let b = reduce(&b)?;
            total = total.add(&b.mul_scalar(weights.bce_greedy)?)?;
            b
        }
        None => Array::scalar(0.0, Dtype::F32)?,
    };
    let acc = l1.mul_scalar(0.5)?.rsub_scalar(1.0)?.stop_gradient()?; // [A, γ]

    // Π_{i≤j} a_i as exp(Σ log a_i) (a is clamped at 0: rounding can take it a hair below).
    let survive = acc.maximum_scalar(0.0)?.log()?.cumsum(1, false, true)?.exp()?;
    let tau = survive.sum(&[1], false)?.add_scalar(1.0)?.mean_all()?;
    // Π_{i≤j} hit_i of 0/1 hits: no miss among the first j.
    let misses = hit.rsub_scalar(1.0)?.cumsum(1, false, true)?;
    let greedy_tau = misses.equal_scalar(0.0)?.astype(Dtype::F32)?.sum(&[1], false)?.add_scalar(1.0)?.mean_all()?;
    Ok(LossTerms { total, ce, tv, bce, bce_greedy, acceptance: acc.mean(&[0], false)?, tau, greedy_tau })
}

/// −[t·log c + (1 − t)·log(1 − c)], elementwise, with c clamped away from 0 and 1.
fn binary_cross_entropy(c: &Array, t: &Array) -> Result<Array> {
    let c = c.maximum_scalar(1e-6)?.minimum_scalar(1.0 - 1e-6)?;
    Ok(t.multiply(&c.log()?)?.add(&t.rsub_scalar(1.0)?.multiply(&c.rsub_scalar(1.0)?.log()?)?)?.negative()?)
}
