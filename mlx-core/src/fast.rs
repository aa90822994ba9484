//! MLX's fused kernels: RMSNorm, RoPE and scaled dot-product attention.

use crate::array::{Array, List};
use crate::error::Result;
use crate::sys::ffi;
use crate::Dtype;

/// `mx.fast.rms_norm(x, weight, eps)`; `weight = None` is MLX's null weight (no scale).
#[track_caller]
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    let w = List::opt(weight)?;
    Array::wrap("rms_norm", ffi::rms_norm(x.raw(), w.raw(), eps))
}

/// Where RoPE frequencies come from.
#[derive(Clone, Copy, Debug)]
pub enum RopeFreqs<'a> {
    /// MLX computes them from `base` (θ).
    Base(f32),
    /// Explicit per-pair wavelengths (`freqs` in `mx.fast.rope`), e.g. proportional RoPE.
    Explicit(&'a Array),
}

/// `mx.fast.rope` over the last axis of `x` (`[B, H, L, D]`) with the position offset given as an
/// int32 array, as mlx-lm passes `cache.offset`.
#[track_caller]
pub fn rope(x: &Array, dims: i32, traditional: bool, freqs: RopeFreqs<'_>, scale: f32, offset: i32) -> Result<Array> {
    let off = Array::scalar(offset as f64, Dtype::I32)?;
    let (base, f) = match freqs {
        RopeFreqs::Base(b) => (b, List::opt(None)?),
        RopeFreqs::Explicit(a) => (0.0, List::opt(Some(a))?),
    };
    Array::wrap("rope", ffi::rope(x.raw(), dims, traditional, base, scale, off.raw(), f.raw()))
}

/// [`rope`] with one offset per batch entry: x `[B, H, L, D]`, `offsets` `[B]` int32 (entry b
/// rotated for positions `offsets[b]..offsets[b]+L`).
pub fn rope_offsets(
    x: &Array,
    dims: i32,
    traditional: bool,
    freqs: RopeFreqs<'_>,
    scale: f32,
    offsets: &Array,
) -> Result<Array> {
    let (base, f) = match freqs {
        RopeFreqs::Base(b) => (b, List::opt(None)?),
        RopeFreqs::Explicit(a) => (0.0, List::opt(Some(a))?),
    };
    Array::wrap("rope", ffi::rope(x.raw(), dims, traditional, base, scale, offsets.raw(), f.raw()))
}

/// The attention mask forms mlx-lm uses (docs/numerics.md, "Masks"); the mode decides the kernel.
#[derive(Clone, Copy, Debug)]
pub enum Mask<'a> {
    /// No mask (single-token decode).
    None,
    /// `"causal"`, bottom-right aligned when there are more keys than queries.
    Causal,
    /// An explicit additive (float) or boolean (true = attend) mask broadcastable to `[B, H, L, S]`.
    Array(&'a Array),
}

/// `mx.fast.scaled_dot_product_attention(q, k, v, scale, mask)` with q `[B, Hq, L, D]` and
/// k, v `[B, Hkv, S, D]`; GQA is handled by MLX when Hq is a multiple of Hkv.
#[track_caller]
pub fn scaled_dot_product_attention(q: &Array, k: &Array, v: &Array, scale: f32, mask: Mask<'_>) -> Result<Array> {
    let (mode, arr) = match mask {
        Mask::None => ("", None),
        Mask::Causal => ("causal", None),
        Mask::Array(a) => ("array", Some(a)),
    };
    let m = List::opt(arr)?;
    Array::wrap("scaled_dot_product_attention", ffi::sdpa(q.raw(), k.raw(), v.raw(), scale, mode, m.raw()))
}
