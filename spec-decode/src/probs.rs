//! One processing pipeline for target (p) and draft (q) rows, so both see exactly the same
//! filters: logprobs → top-p → min-p → top-k (gemma4::sampling, mlx-lm's order) → ×1/T, then
//! f32. For a bf16 target this is bit-for-bit what plain decoding feeds `categorical`; draft
//! logits arrive in f32 and stay f32 (sampling drafts from bf16 logits biases q).

use gemma4::sampling::{filter, logprobs, SamplerConfig};
use mlx_core::{Array, Dtype};

use crate::error::Result;

/// Processed logits (temperature applied, filtered tokens at -inf) in f32 // `[.., V]`
pub fn processed_logits(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    let lp = filter(&logprobs(logits)?, cfg)?;
    let t = if cfg.temperature > 0.0 { cfg.temperature } else { 1.0 };
    Ok(lp.mul_scalar(1.0 / t)?.astype(Dtype::F32)?)
}

/// The distribution a sampler draws from // `[.., V]` f32
pub fn probabilities(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    Ok(processed_logits(logits, cfg)?.softmax(&[-1], true)?)
}
