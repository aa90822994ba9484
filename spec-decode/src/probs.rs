//! One processing pipeline for target (p) and draft (q) rows, so both see exactly the same
//! filters: logprobs → top-p → min-p → top-k (gemma4::sampling, mlx-lm's order) → ×1/T, then
//! f32. Draft logits arrive in f32 and stay f32 (sampling drafts from bf16 logits biases q).
//!
//! Without filters the normalisation is skipped: softmax(logits / T) is the same distribution
//! as softmax(logprobs / T), and the logsumexp it saves is a transcendental per vocabulary entry
//! and row, which MLX's CPU kernels evaluate one element at a time (≈ 12 ns each; a 4096-token
//! row costs 50 µs, as much as a decode step of the default's smallest layers).

use gemma4::sampling::{filter, logprobs, SamplerConfig};
use mlx_core::{Array, Dtype};

use crate::error::Result;

/// True when the sampler applies no top-p, min-p or top-k filter.
pub fn filters_nothing(cfg: &SamplerConfig) -> bool {
    !(cfg.top_p > 0.0 && cfg.top_p < 1.0) && cfg.min_p == 0.0 && cfg.top_k == 0
}

/// Processed logits (temperature applied, filtered tokens at -inf) in f32 // `[.., V]`
pub fn processed_logits(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    let t = if cfg.temperature > 0.0 { cfg.temperature } else { 1.0 };
    let lp = if filters_nothing(cfg) { logits.astype(Dtype::F32)? } else { filter(&logprobs(logits)?, cfg)? };
    Ok(if t == 1.0 { lp.astype(Dtype::F32)? } else { lp.mul_scalar(1.0 / t)?.astype(Dtype::F32)? })
}

/// The distribution a sampler draws from // `[.., V]` f32
pub fn probabilities(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    Ok(processed_logits(logits, cfg)?.softmax(&[-1], true)?)
}

/// Inverse-CDF sampling, one token per row: token i is drawn when the running sum of `weights`
/// before i is ≤ u·total < the running sum through i, i.e. with probability `weights[i] / total`.
/// A token of weight 0 adds nothing to the running sum, so it is never drawn, and the index is
/// capped at the last token of positive weight (u·total can round up to the total). One
/// uniform per row instead of Gumbel-max's two logarithms per vocabulary entry.
/// `weights` // `[R, V]` f32, non-negative, not necessarily normalised; `u` // `[R]` in [0, 1)
/// -> `[R]` u32
pub fn sample_rows(weights: &Array, u: &Array) -> Result<Array> {
    let v = weights.dim(-1)?;
    let cdf = weights.cumsum(-1, false, true)?; // [R, V]
    let total = cdf.slice_axis(-1, v - 1, v)?; // [R, 1]
    let x = u.reshape(&[-1, 1])?.multiply(&total)?; // [R, 1]
    let below = cdf.less_equal(&x)?.astype(Dtype::U32)?.sum(&[-1], false)?; // [R]
    let last_positive = cdf.less(&total)?.astype(Dtype::U32)?.sum(&[-1], false)?; // [R]
    Ok(below.minimum(&last_positive)?.astype(Dtype::U32)?)
}
