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
use crate::quant::Quantized;

/// A weight matrix `[N, K]` of a fused node: dense (f32, or bf16 read as the f32 values it
/// holds), or an MLX-affine 8/4-bit one read packed (f32 scales and biases; see
/// [`crate::quant::row_quantized_linear`] for its arithmetic).
#[derive(Clone, Copy, Debug)]
pub enum RowWeight<'a> {
    /// `[N, K]` f32 or bf16
    Dense(&'a Array),
    /// packed `[N, K·bits/32]` uint32 with `[N, K / group]` f32 scales and biases
    Packed(&'a Quantized),
}

impl<'a> RowWeight<'a> {
    /// The array that stands in the node's inputs for this matrix.
    fn matrix(&self) -> &'a Array {
        match self {
            RowWeight::Dense(w) => w,
            RowWeight::Packed(q) => &q.weight,
        }
    }

    /// (bits, group): (0, 0) when dense.
    fn packing(&self) -> [i32; 2] {
        match self {
            RowWeight::Dense(_) => [0, 0],
            RowWeight::Packed(q) => [q.spec.bits() as i32, q.spec.group_size() as i32],
        }
    }

    /// Scales and biases, when packed: the inputs after a node's fixed ones.
    fn extras(&self) -> impl Iterator<Item = &'a Array> {
        let q = match self {
            RowWeight::Packed(q) => Some(*q),
            RowWeight::Dense(_) => None,
        };
        q.into_iter().flat_map(|q| [&q.scales, &q.biases])
    }
}

/// The packing flags and the extra inputs of a node's matrices, in order.
fn packing<'a>(ws: &[RowWeight<'a>]) -> (Vec<i32>, Vec<&'a Array>) {
    (ws.iter().flat_map(RowWeight::packing).collect(), ws.iter().flat_map(RowWeight::extras).collect())
}

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
    pub wq: RowWeight<'a>,
    /// `[D]`
    pub q_norm: &'a Array,
    /// `[Hkv·D, H]`
    pub wk: RowWeight<'a>,
    /// `[D]`
    pub k_norm: &'a Array,
    /// `[Hkv·D, H]`
    pub wv: RowWeight<'a>,
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
    let (flags, extras) = packing(&[w.wq, w.wk, w.wv]);
    let fixed = [
        rows.x,
        w.input_norm,
        w.wq.matrix(),
        w.q_norm,
        w.wk.matrix(),
        w.k_norm,
        w.wv.matrix(),
        rows.positions,
        w.inv_freqs,
    ];
    let inputs = List::new(fixed.into_iter().chain(extras))?;
    let out = crate::sys::ffi::row_qkv(inputs.raw(), &flags, w.head_dim as i32, rows.batch as i32, eps)
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
    pub wo: RowWeight<'a>,
    /// `[H]`
    pub post_attention_norm: &'a Array,
    /// `[H]`
    pub pre_feedforward_norm: &'a Array,
    /// `[F, H]`
    pub w_gate: RowWeight<'a>,
    /// `[F, H]`
    pub w_up: RowWeight<'a>,
    /// `[H, F]`
    pub w_down: RowWeight<'a>,
    /// `[H]`
    pub post_feedforward_norm: &'a Array,
    /// one value
    pub layer_scalar: &'a Array,
    /// Gemma-4's per-layer input branch (PLE), in layers that have one.
    pub per_layer: Option<PerLayerTail<'a>>,
}

/// The per-layer-input branch at the end of a PLE layer (see [`ffn`]).
#[derive(Clone, Copy, Debug)]
pub struct PerLayerTail<'a> {
    /// `[R, P]`: this layer's slice of the per-layer inputs, one row per row of x
    pub input: &'a Array,
    /// `[P, H]`
    pub gate: RowWeight<'a>,
    /// `[H, P]`
    pub projection: RowWeight<'a>,
    /// `[H]`
    pub post_norm: &'a Array,
}

/// Everything after attention: `h = x + rms_norm(a·woᵀ)·post_attention_norm`,
/// `t = rms_norm(h)·pre_feedforward_norm`,
/// `h = h + rms_norm((gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ)·post_feedforward_norm`; with a
/// per-layer tail `h = h + rms_norm((gelu(h·gateᵀ) ∗ input)·projectionᵀ)·post_norm`;
/// `out = h·layer_scalar`.
/// a // `[R, Hq·D]`, x // `[R, H]` -> `[R, H]`
#[track_caller]
pub fn ffn(a: &Array, x: &Array, w: &FfnWeights<'_>, eps: f32) -> Result<Array> {
    let mut matrices = vec![w.wo, w.w_gate, w.w_up, w.w_down];
    let mut fixed = vec![
        a,
        x,
        w.wo.matrix(),
        w.post_attention_norm,
        w.pre_feedforward_norm,
        w.w_gate.matrix(),
        w.w_up.matrix(),
        w.w_down.matrix(),
        w.post_feedforward_norm,
        w.layer_scalar,
    ];
    if let Some(p) = &w.per_layer {
        matrices.extend([p.gate, p.projection]);
        fixed.extend([p.input, p.gate.matrix(), p.projection.matrix(), p.post_norm]);
    }
    let (flags, extras) = packing(&matrices);
    let inputs = List::new(fixed.into_iter().chain(extras))?;
    Array::wrap("row_ffn", crate::sys::ffi::row_ffn(inputs.raw(), &flags, w.per_layer.is_some(), eps))
}

/// `rms_norm(x)·w` over the last axis of f32 `x` (no weight: the plain norm), one node: MLX's
/// `fast::rms_norm` has no CPU kernel and composes five. Each row's bits are its own. The
/// gradient goes through MLX's form. x // `[.., D]`, w // `[D]` -> `[.., D]`
#[track_caller]
pub fn rms_norm(x: &Array, w: Option<&Array>, eps: f32) -> Result<Array> {
    let inputs = List::new(std::iter::once(x).chain(w))?;
    Array::wrap("row_rms_norm", crate::sys::ffi::row_rms_norm(inputs.raw(), eps))
}

/// A pre-norm layer's attention input (DSpark's backbone and its context projection), one node:
/// `xn = rms_norm(x)·norm`, then per matrix `xn·wᵀ` laid out by head. No per-head norms, no
/// rotation. x // `[B·L, H]` (batch-major) -> per matrix `[B, heads, L, head_dim]`
#[track_caller]
pub fn normed_heads(
    x: &Array,
    batch: usize,
    norm: &Array,
    ws: &[RowWeight<'_>],
    head_dim: usize,
    eps: f32,
) -> Result<Vec<Array>> {
    let (flags, extras) = packing(ws);
    let fixed = [x, norm].into_iter().chain(ws.iter().map(RowWeight::matrix));
    let inputs = List::new(fixed.chain(extras))?;
    let out = crate::sys::ffi::row_normed_heads(inputs.raw(), &flags, head_dim as i32, batch as i32, eps)
        .map_err(|e| crate::error::mlx_err("row_normed_heads", e))?;
    List(out).into_vec("row_normed_heads")
}

/// The weights of [`prenorm_ffn`].
#[derive(Clone, Copy, Debug)]
pub struct PreNormFfnWeights<'a> {
    /// `[H, A]`
    pub wo: RowWeight<'a>,
    /// `[H]`
    pub ff_norm: &'a Array,
    /// `[F, H]`
    pub w_gate: RowWeight<'a>,
    /// `[F, H]`
    pub w_up: RowWeight<'a>,
    /// `[H, F]`
    pub w_down: RowWeight<'a>,
}

/// A pre-norm layer after attention (DSpark's backbone), one node: `h = x + a·woᵀ`,
/// `out = h + (gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ` with `t = rms_norm(h)·ff_norm`.
/// a // `[R, A]`, x // `[R, H]` -> `[R, H]`
#[track_caller]
pub fn prenorm_ffn(a: &Array, x: &Array, w: &PreNormFfnWeights<'_>, eps: f32) -> Result<Array> {
    let (flags, extras) = packing(&[w.wo, w.w_gate, w.w_up, w.w_down]);
    let fixed = [a, x, w.wo.matrix(), w.ff_norm, w.w_gate.matrix(), w.w_up.matrix(), w.w_down.matrix()];
    let inputs = List::new(fixed.into_iter().chain(extras))?;
    Array::wrap("row_prenorm_ffn", crate::sys::ffi::row_prenorm_ffn(inputs.raw(), &flags, eps))
}
