//! A dense decoder layer's few-row chains as two graph nodes on the CPU (`sys/row_layer.cc`):
//! the attention's input side up to RoPE ([`qkv`]) and everything after attention ([`ffn`]).
//!
//! Composed from MLX's ops these chains are about forty small nodes per layer, and MLX spends
//! ~10 µs of host work per node on a CPU: for a small model that, not arithmetic, is the decode
//! step. Here each chain is one node running the row kernels' loops (the products are
//! [`crate::blas::row_linear`]'s), with every row's bits independent of how many rows are
//! computed together, so decode steps and verify windows agree. The values are the composed
//! form's up to the rounding of the norms' sums. f32 and CPU only, and no gradient.

use crate::array::{Array, List};
use crate::error::Result;

/// The rows [`qkv`] projects: `x` // `[B·L, H]` f32 (batch-major), with the position of each of
/// the L rows // `[L]` int32.
#[derive(Clone, Copy, Debug)]
pub struct QkvRows<'a> {
    /// `[B·L, H]`
    pub x: &'a Array,
    /// B
    pub batch: usize,
    /// `[L]` int32: RoPE positions
    pub positions: &'a Array,
}

/// The weights of [`qkv`]: the layer's input norm, the three projections, the q/k norms and
/// the RoPE inverse frequencies.
#[derive(Clone, Copy, Debug)]
pub struct QkvWeights<'a> {
    /// `[H]`
    pub input_norm: &'a Array,
    /// `[Hq·D, H]`
    pub wq: &'a Array,
    /// `[D]`
    pub q_norm: &'a Array,
    /// `[Hkv·D, H]`
    pub wk: &'a Array,
    /// `[D]`
    pub k_norm: &'a Array,
    /// `[Hkv·D, H]`
    pub wv: &'a Array,
    /// `[D / 2]`: pair i of a head at position p turns by `p · inv_freqs[i]`
    pub inv_freqs: &'a Array,
    /// D
    pub head_dim: usize,
}

/// The attention's input side: `xn = rms_norm(x)·input_norm`; `q = xn·wqᵀ`, `k = xn·wkᵀ`,
/// `v = xn·wvᵀ`; each head RMS-normed over D (q with `q_norm`, k with `k_norm`, v without
/// weight); q and k rotated by RoPE (MLX's non-traditional layout: pair (i, i + D/2)) at their
/// row's position. -> (q `[B, Hq, L, D]`, k `[B, Hkv, L, D]`, v `[B, Hkv, L, D]`), the layout
/// attention and the KV cache take.
#[track_caller]
pub fn qkv(rows: &QkvRows<'_>, w: &QkvWeights<'_>, eps: f32) -> Result<(Array, Array, Array)> {
    let inputs = List::new([rows.x, w.input_norm, w.wq, w.q_norm, w.wk, w.k_norm, w.wv, rows.positions, w.inv_freqs])?;
    let out = crate::sys::ffi::row_qkv(inputs.raw(), w.head_dim as i32, rows.batch as i32, eps)
        .map_err(|e| crate::error::mlx_err("row_qkv", e))?;
    let mut out = List(out).into_vec("row_qkv")?.into_iter();
    match (out.next(), out.next(), out.next()) {
        (Some(q), Some(k), Some(v)) => Ok((q, k, v)),
        _ => Err(crate::Error::Mlx {
            op: "row_qkv",
            message: "expected three outputs".into(),
            location: std::panic::Location::caller(),
        }),
    }
}

/// The weights of [`ffn`]: output projection, norms, GeGLU MLP and the layer scalar.
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// `[H, Hq·D]`
    pub wo: &'a Array,
    /// `[H]`
    pub post_attention_norm: &'a Array,
    /// `[H]`
    pub pre_feedforward_norm: &'a Array,
    /// `[F, H]`
    pub w_gate: &'a Array,
    /// `[F, H]`
    pub w_up: &'a Array,
    /// `[H, F]`
    pub w_down: &'a Array,
    /// `[H]`
    pub post_feedforward_norm: &'a Array,
    /// one value
    pub layer_scalar: &'a Array,
}

/// Everything after attention: `h = x + rms_norm(a·woᵀ)·post_attention_norm`,
/// `t = rms_norm(h)·pre_feedforward_norm`,
/// `out = (h + rms_norm((gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ)·post_feedforward_norm)·layer_scalar`.
/// a // `[R, Hq·D]`, x // `[R, H]` -> `[R, H]`
#[track_caller]
pub fn ffn(a: &Array, x: &Array, w: &FfnWeights<'_>, eps: f32) -> Result<Array> {
    let inputs = List::new([
        a,
        x,
        w.wo,
        w.post_attention_norm,
        w.pre_feedforward_norm,
        w.w_gate,
        w.w_up,
        w.w_down,
        w.post_feedforward_norm,
        w.layer_scalar,
    ])?;
    Array::wrap("row_ffn", crate::sys::ffi::row_ffn(inputs.raw(), eps))
}

/// `rms_norm(x)·w` over the last axis of f32 `x` (no weight: the plain norm), one node: MLX's
/// `fast::rms_norm` has no CPU kernel and composes five. Each row's bits are its own. The
/// gradient goes through MLX's form. x // `[.., D]`, w // `[D]` -> `[.., D]`
#[track_caller]
pub fn rms_norm(x: &Array, w: Option<&Array>, eps: f32) -> Result<Array> {
    let inputs = List::new(std::iter::once(x).chain(w))?;
    Array::wrap("row_rms_norm", crate::sys::ffi::row_rms_norm(inputs.raw(), eps))
}
