//! One processing pipeline for target (p) and draft (q) rows, so both see exactly the same
//! filters: logit bias → logprobs → top-p → min-p → top-k (gemma4::sampling, mlx-lm's order) →
//! ×1/T, then f32. The bias is part of the law a request asks for: p must carry it (that is what
//! makes the output plain decoding's law with the bias); on q it only raises acceptance. For a
//! bf16 target this is bit for bit what plain decoding feeds its sampler. Draft logits arrive
//! in f32 and stay f32 (sampling drafts from bf16 logits biases q).
//!
//! For f32 rows without filters the normalisation is skipped: softmax(logits / T) is the same
//! distribution as softmax(logprobs / T) up to f32 rounding, and the logsumexp it saves is a
//! transcendental per vocabulary entry and row, which MLX's CPU kernels evaluate one element
//! at a time (≈ 12 ns each: 50 µs for a 4096-entry row).
//!
//! On the CPU, f32 rows go through mlx-core's sampling kernels (`mlx_core::row_sample`, the
//! switch of the other row kernels): one graph node for a block's probabilities and one per
//! draw, where the composed pipeline takes about a dozen nodes per row, each ~10 µs of
//! scheduling. They carry the same law up to the rounding of sums; the composed forms stay for
//! bf16 rows (plain decoding's exact pipeline), the GPU, and as the reference the tests and the
//! distribution gate compare with.

use gemma4::sampling::{apply_logit_bias, filter, logprobs, SamplerConfig};
use mlx_core::row_sample::{self, RowFilter};
use mlx_core::{where_, Array, Dtype};

use crate::error::Result;
use crate::verify::accept::RESIDUAL_MASS_EPSILON;

/// True when the sampler applies no top-p, min-p or top-k filter.
pub fn filters_nothing(cfg: &SamplerConfig) -> bool {
    !(cfg.top_p > 0.0 && cfg.top_p < 1.0) && cfg.min_p == 0.0 && cfg.top_k == 0
}

/// Processed logits (temperature applied, filtered tokens at -inf) in f32 // `[.., V]`
pub fn processed_logits(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    let logits = &apply_logit_bias(logits, &cfg.logit_bias)?;
    let t = if cfg.temperature > 0.0 { cfg.temperature } else { 1.0 };
    // The shortcut only for f32 rows: a bf16 target's plain sampler draws from bf16 logprobs
    // scaled in bf16, and p must be that law to the bit.
    let shortcut = filters_nothing(cfg) && logits.dtype() == Dtype::F32;
    let lp = if shortcut { logits.clone() } else { filter(&logprobs(logits)?, cfg)? };
    Ok(if t == 1.0 { lp.astype(Dtype::F32)? } else { lp.mul_scalar(1.0 / t)?.astype(Dtype::F32)? })
}

/// The distribution a sampler draws from // `[.., V]` f32
pub fn probabilities(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    if !mlx_core::blas::row_kernels_for(logits)? {
        return composed_probabilities(logits, cfg);
    }
    let shape = logits.shape()?;
    let biased = apply_logit_bias(logits, &cfg.logit_bias)?;
    let rows = biased.reshape(&[-1, logits.dim(-1)?])?; // [R, V]
    let f = RowFilter {
        temperature: cfg.temperature,
        top_p: cfg.top_p,
        min_p: cfg.min_p,
        min_keep: cfg.min_tokens_to_keep,
        top_k: cfg.top_k,
    };
    Ok(row_sample::probabilities(&rows, &f)?.reshape(&shape)?)
}

/// [`probabilities`] composed from MLX's ops, as plain decoding's sampler sees it: the
/// reference law. `[.., V]` -> `[.., V]` f32
pub fn composed_probabilities(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    Ok(processed_logits(logits, cfg)?.softmax(&[-1], true)?)
}

/// Inverse-CDF sampling, one token per row: the first token of positive weight whose running
/// sum of `weights` exceeds u·total, i.e. token i with probability `weights[i] / total` up to the
/// rounding of an f32 running sum (about 6e-8 of the total per entry). Requiring positive
/// weight keeps filtered-out tokens (and a residual's zeros) undrawable even where a parallel
/// scan does not add in order; if u·total rounds up to the total, the last positive token is
/// drawn. One uniform per row instead of Gumbel-max's two logarithms per vocabulary entry.
/// `weights` // `[R, V]` f32, non-negative, not necessarily normalised; `u` // `[R]` in [0, 1)
/// -> `[R]` u32
pub fn sample_rows(weights: &Array, u: &Array) -> Result<Array> {
    if mlx_core::blas::row_kernels_for(weights)? {
        return Ok(row_sample::draw(weights, u)?);
    }
    composed_sample_rows(weights, u)
}

/// [`sample_rows`] composed from MLX's ops (the GPU's form, and the kernel's reference).
pub fn composed_sample_rows(weights: &Array, u: &Array) -> Result<Array> {
    let v = weights.dim(-1)?;
    let cdf = weights.cumsum(-1, false, true)?; // [R, V]
    let total = cdf.slice_axis(-1, v - 1, v)?; // [R, 1]
    let x = u.reshape(&[-1, 1])?.multiply(&total)?; // [R, 1]
    let positive = weights.greater_scalar(0.0)?.astype(Dtype::U32)?; // [R, V]
    let passes = cdf.greater(&x)?.astype(Dtype::U32)?.multiply(&positive)?; // [R, V]
    let first = passes.argmax(-1, false)?.astype(Dtype::U32)?; // [R] (0 when none passes)
    let found = passes.max(&[-1], false)?.greater_scalar(0.0)?; // [R]
    let index = Array::arange(0.0, f64::from(v), 1.0, Dtype::U32)?; // [V]
    let last_positive = positive.multiply(&index)?.argmax(-1, false)?.astype(Dtype::U32)?; // [R]
    Ok(where_(&found, &first, &last_positive)?)
}

/// One draw per row from the residual max(p − q, 0), or from p where that mass is (numerically)
/// zero (`verify::residual_weights`), with the uniforms `u`.
/// `p`, `q` // `[d, V]` f32, `u` // `[d]` f32 -> `[d]` u32
pub fn sample_residual_rows(p: &Array, q: &Array, u: &Array) -> Result<Array> {
    if mlx_core::blas::row_kernels_for(p)? && q.dtype() == Dtype::F32 {
        return Ok(row_sample::draw_residual(p, q, u, RESIDUAL_MASS_EPSILON as f32)?);
    }
    composed_sample_rows(&crate::verify::residual_weights(p, q)?, u)
}
