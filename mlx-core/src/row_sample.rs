//! Sampling rows of f32 logits on the CPU, one graph node per step (`sys/row_sample.cc`): a
//! speculative-sampling round composed from MLX's ops took about a hundred nodes for this (a
//! logsumexp, a sort for top-p, a softmax and a cumulative-sum draw per row), each costing ~10 µs
//! of scheduling on a CPU, and MLX's CPU kernels evaluate `exp` one element at a time.
//!
//! The law is that of the composed pipeline (mlx-lm's sampler: top-p, min-p, top-k on the
//! logprobs, then 1/T, then softmax); the sums round differently, so probabilities agree to
//! about 1e-6 relative, not bit for bit. CPU only: callers keep the composed form for the GPU.

use crate::array::{Array, List};
use crate::error::Result;

/// The filters and temperature a sampler applies to each row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowFilter {
    /// Applied last, as a factor 1/T on the filtered logprobs; 0 counts as 1.
    pub temperature: f64,
    /// Nucleus mass; on when 0 < top_p < 1.
    pub top_p: f64,
    /// Minimum probability relative to the top token; on when > 0.
    pub min_p: f64,
    /// Tokens min-p keeps whatever their probability (≥ 1).
    pub min_keep: usize,
    /// Keep the k most probable tokens; 0 is off.
    pub top_k: usize,
}

/// The distribution each row is drawn from // logits `[R, V]` f32 -> `[R, V]` f32
#[track_caller]
pub fn probabilities(logits: &Array, f: &RowFilter) -> Result<Array> {
    let t = if f.temperature > 0.0 { f.temperature } else { 1.0 };
    let (keep, k) = (f.min_keep.min(i32::MAX as usize) as i32, f.top_k.min(i32::MAX as usize) as i32);
    Array::wrap("row_probs", crate::sys::ffi::row_probs(logits.raw(), (1.0 / t) as f32, f.top_p, f.min_p, keep, k))
}

/// One inverse-CDF draw per row: the first token of positive weight whose running sum (in token
/// order) exceeds u·total, or the last positive token if u·total rounds up to the total.
/// `weights` // `[R, V]` f32, non-negative; `u` // `[R]` f32 in [0, 1) -> `[R]` u32
#[track_caller]
pub fn draw(weights: &Array, u: &Array) -> Result<Array> {
    let none = List::new(std::iter::empty())?;
    Array::wrap("row_draw", crate::sys::ffi::row_draw(weights.raw(), u.raw(), none.raw(), 0.0))
}

/// [`draw`] from each row's residual max(p − q, 0), or from p itself where the residual's mass
/// is at most `empty_mass` (p ≤ q everywhere up to rounding). `p`, `q` // `[R, V]` f32 -> `[R]` u32
#[track_caller]
pub fn draw_residual(p: &Array, q: &Array, u: &Array, empty_mass: f32) -> Result<Array> {
    let q = List::new(std::iter::once(q))?;
    Array::wrap("row_draw", crate::sys::ffi::row_draw(p.raw(), u.raw(), q.raw(), empty_mass))
}
