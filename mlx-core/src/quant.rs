//! MLX affine quantization: groups of `group_size` consecutive input elements share a scale and
//! a bias (dequantized value = scale·q + bias), packed into uint32 words, element 0 in the low bits.

use crate::array::{Array, List};
use crate::error::{Error, Result};
use crate::sys::ffi;

/// Bits per weight and group size of an affine quantization; invalid pairs cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantSpec {
    bits: u8,
    group_size: u16,
}

/// Bit widths MLX's affine mode supports.
pub const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine mode supports.
pub const SUPPORTED_GROUP_SIZES: [u32; 3] = [32, 64, 128];

impl QuantSpec {
    /// Validates `bits` ∈ {2,3,4,5,6,8} and `group_size` ∈ {32,64,128}.
    pub fn new(bits: u32, group_size: u32) -> Result<QuantSpec> {
        if !SUPPORTED_BITS.contains(&bits) {
            return Err(Error::Host {
                op: "QuantSpec",
                detail: format!("bits {bits} unsupported, expected one of {SUPPORTED_BITS:?}"),
            });
        }
        if !SUPPORTED_GROUP_SIZES.contains(&group_size) {
            return Err(Error::Host {
                op: "QuantSpec",
                detail: format!("group_size {group_size} unsupported, expected one of {SUPPORTED_GROUP_SIZES:?}"),
            });
        }
        Ok(QuantSpec { bits: bits as u8, group_size: group_size as u16 })
    }

    /// Bits per weight.
    pub fn bits(&self) -> u32 {
        self.bits as u32
    }

    /// Elements per scale/bias group.
    pub fn group_size(&self) -> u32 {
        self.group_size as u32
    }
}

/// A quantized matrix: packed `weight` uint32 `[out, in·bits/32]`, `scales` and `biases`
/// `[out, in/group_size]` in the source dtype.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// Packed uint32 words, `[out, in·bits/32]`.
    pub weight: Array,
    /// One scale per group, `[out, in/group_size]`.
    pub scales: Array,
    /// One bias (offset) per group, `[out, in/group_size]`.
    pub biases: Array,
    /// Bits per element and group size the matrix was quantized with.
    pub spec: QuantSpec,
}

/// Quantizes `w` along its last axis.
#[track_caller]
pub fn quantize(w: &Array, spec: QuantSpec) -> Result<Quantized> {
    let l = ffi::quantize(w.raw(), spec.group_size() as i32, spec.bits() as i32, "affine")
        .map_err(|e| crate::error::mlx_err("quantize", e))?;
    let mut v = List(l).into_vec("quantize")?.into_iter();
    match (v.next(), v.next(), v.next()) {
        (Some(weight), Some(scales), Some(biases)) => Ok(Quantized { weight, scales, biases, spec }),
        _ => Err(Error::Host { op: "quantize", detail: "expected weight, scales and biases from MLX".into() }),
    }
}

impl Quantized {
    /// Back to a dense array in the scales' dtype.
    #[track_caller]
    pub fn dequantize(&self) -> Result<Array> {
        dequantize(&self.weight, &self.scales, &self.biases, self.spec)
    }

    /// `x @ Wᵀ` for the quantized W `[out, in]` (an `nn.QuantizedLinear` forward). A matrix the
    /// row kernels read packed ([`Quantized::row_readable`]) goes to [`row_quantized_linear`]
    /// for few rows when they are active (decode steps, verify windows: a row's bits do not
    /// depend on the batch) and to the f32 BLAS on the dequantized matrix for more (prefill:
    /// MLX's CPU quantized matmul is far slower than the BLAS); otherwise MLX's quantized
    /// matmul, as mlx-lm (`MLX_CORE_ROW_LINEAR=0` for the parity gate).
    #[track_caller]
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        if self.row_readable() && crate::blas::row_kernels_for(x)? {
            let inp = x.shape()?.last().copied().unwrap_or(0).max(1) as usize;
            let rows = x.size()? / inp;
            if rows > 0 && rows <= crate::blas::ROW_LINEAR_MAX_ROWS {
                return row_quantized_linear(x, self);
            }
            return crate::blas::matmul_t(x, &self.dequantize()?);
        }
        quantized_matmul(x, &self.weight, &self.scales, &self.biases, true, self.spec)
    }

    /// Whether [`row_quantized_linear`] can read this matrix: 8 or 4 bits, f32 scales and biases.
    pub fn row_readable(&self) -> bool {
        matches!(self.spec.bits(), 4 | 8)
            && self.scales.dtype() == crate::dtype::Dtype::F32
            && self.biases.dtype() == crate::dtype::Dtype::F32
            && self.weight.ndim().is_ok_and(|n| n == 2)
    }

    /// Rows `ids` of the table, dequantized (`QuantizedEmbedding`: gather, then dequantize).
    #[track_caller]
    pub fn gather_rows(&self, ids: &Array) -> Result<Array> {
        let w = self.weight.take(ids, 0)?;
        let s = self.scales.take(ids, 0)?;
        let b = self.biases.take(ids, 0)?;
        dequantize(&w, &s, &b, self.spec)
    }
}

/// `x @ Wᵀ` for f32 `x` `[.., K]` and an 8- or 4-bit `q` `[N, K]` with f32 scales and biases,
/// on the CPU -> `[.., N]`: the packed weights are dequantized in registers (`fma(q, scale,
/// bias)` in f32) and multiplied with [`crate::blas::row_linear`]'s arithmetic, so each row's
/// bits are those of `row_linear` on the matrix dequantized with the same fma, independent of
/// the number of rows and of the row's place. Streams the packed bytes once per call.
///
/// 4-bit matrices whose K is a multiple of 128 take an integer path instead (see
/// [`int8_activations`]): each row of `x` is quantized to 8 bits in blocks of 32 inputs and
/// multiplied by the nibbles with exact integer dot products, then scaled in f32 per lane in a
/// fixed order; rows stay independent of the batch, and outputs differ from the f32 product by
/// the activations' rounding (as llama.cpp's q4 kernels do).
#[track_caller]
pub fn row_quantized_linear(x: &Array, q: &Quantized) -> Result<Array> {
    Array::wrap(
        "row_quantized_linear",
        ffi::row_quantized_linear(
            x.raw(),
            q.weight.raw(),
            q.scales.raw(),
            q.biases.raw(),
            q.spec.group_size() as i32,
            q.spec.bits() as i32,
        ),
    )
}

/// Whether [`row_quantized_linear`] on a `k`-column matrix of `bits` takes its integer path
/// (8-bit activations): 4 bits, `k` a multiple of 128, and `MLX_CORE_Q4_F32` unset in the
/// process (set, 4-bit products stay on the f32 kernel).
pub fn int8_activations(k: usize, bits: u32) -> bool {
    ffi::row_quantized_int8_activations(k as i32, bits as i32)
}

/// Whether [`row_quantized_linear`]'s vector forms (AVX-512, AVX2, where they run) give its
/// portable form's bits on random packed `[n, k]` weights and `[m, k]` inputs.
pub fn row_quantized_paths_agree(m: usize, k: usize, n: usize, spec: QuantSpec) -> bool {
    ffi::row_quantized_paths_agree(m as i32, k as i32, n as i32, spec.bits() as i32, spec.group_size() as i32)
}

/// `mx.dequantize(w, scales, biases, group_size, bits)`.
#[track_caller]
pub fn dequantize(w: &Array, scales: &Array, biases: &Array, spec: QuantSpec) -> Result<Array> {
    let b = List::opt(Some(biases))?;
    Array::wrap(
        "dequantize",
        ffi::dequantize(w.raw(), scales.raw(), b.raw(), spec.group_size() as i32, spec.bits() as i32, "affine"),
    )
}

/// `mx.quantized_matmul(x, w, scales, biases, transpose, group_size, bits)`.
#[track_caller]
pub fn quantized_matmul(
    x: &Array,
    w: &Array,
    scales: &Array,
    biases: &Array,
    transpose: bool,
    spec: QuantSpec,
) -> Result<Array> {
    let b = List::opt(Some(biases))?;
    Array::wrap(
        "quantized_matmul",
        ffi::quantized_matmul(
            x.raw(),
            w.raw(),
            scales.raw(),
            b.raw(),
            transpose,
            spec.group_size() as i32,
            spec.bits() as i32,
            "affine",
        ),
    )
}

/// `mx.gather_qmm(x, w, scales, biases, rhs_indices=idx, transpose, ...)` for switch (MoE) layers.
#[track_caller]
pub fn gather_qmm(
    x: &Array,
    q: &Quantized,
    rhs_indices: &Array,
    transpose: bool,
    sorted_indices: bool,
) -> Result<Array> {
    let b = List::opt(Some(&q.biases))?;
    Array::wrap(
        "gather_qmm",
        ffi::gather_qmm(
            x.raw(),
            q.weight.raw(),
            q.scales.raw(),
            b.raw(),
            rhs_indices.raw(),
            transpose,
            q.spec.group_size() as i32,
            q.spec.bits() as i32,
            "affine",
            sorted_indices,
        ),
    )
}

/// `mx.gather_mm(a, b, rhs_indices=idx)` for dense switch layers.
#[track_caller]
pub fn gather_mm(a: &Array, b: &Array, rhs_indices: &Array, sorted_indices: bool) -> Result<Array> {
    Array::wrap("gather_mm", ffi::gather_mm(a.raw(), b.raw(), rhs_indices.raw(), sorted_indices))
}
