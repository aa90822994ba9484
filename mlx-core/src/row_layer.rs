//! A dense decoder layer's few-row chains as two graph nodes on the CPU (`sys/row_layer.cc`):
//! the attention's input side ([`qkv`]) and everything after attention ([`ffn`]).
//!
//! Composed from MLX's ops these chains are about forty small nodes per layer, and MLX spends
//! ~10 µs of host work per node on a CPU: for a small model that, not arithmetic, is the decode
//! step. Here each chain is one node running the row kernels' loops (the products are
//! [`crate::blas::row_linear`]'s), with every row's bits independent of how many rows are
//! computed together, so decode steps and verify windows agree. The values are the composed
//! form's up to the rounding of the norms' sums. f32 and CPU only, and no gradient.

use crate::array::{Array, List};
use crate::error::Result;

/// The attention's input side: `xn = rms_norm(x)·input_norm`, then `q = xn·wqᵀ`, `k = xn·wkᵀ`,
/// `v = xn·wvᵀ`, each head RMS-normed over `head_dim` (q with `q_norm`, k with `k_norm`, v
/// without weight). x // `[R, H]`, input_norm // `[H]`, wq // `[Hq·D, H]`, q_norm // `[D]`,
/// wk, wv // `[Hkv·D, H]`, k_norm // `[D]` -> (q `[R, Hq·D]`, k `[R, Hkv·D]`, v `[R, Hkv·D]`)
#[allow(clippy::too_many_arguments)]
#[track_caller]
pub fn qkv(
    x: &Array,
    input_norm: &Array,
    wq: &Array,
    q_norm: &Array,
    wk: &Array,
    k_norm: &Array,
    wv: &Array,
    head_dim: usize,
    eps: f32,
) -> Result<(Array, Array, Array)> {
    let inputs = List::new([x, input_norm, wq, q_norm, wk, k_norm, wv])?;
    let out = crate::sys::ffi::row_qkv(inputs.raw(), head_dim as i32, eps)
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
