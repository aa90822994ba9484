//! RoPE per layer kind. Proportional frequencies are computed with MLX ops on
//! the device, exactly as mlx-lm's `ProportionalRoPE` does: host math differs in the last ulp.

use mlx_core::fast::{self, RopeFreqs};
use mlx_core::{concatenate, Array, Dtype};

use crate::config::{RopeSpec, RopeType};
use crate::error::Result;

/// A layer's rotary embedding.
#[derive(Clone, Debug)]
pub enum Rope {
    /// `nn.RoPE(dims, traditional=False, base=θ)`.
    Default {
        /// Rotated width (the whole head).
        dims: i32,
        /// Base frequency θ.
        base: f32,
    },
    /// Wavelengths `factor·θ^(2j/D)` for the rotated pairs and +inf (identity) for the rest.
    Proportional {
        /// Head width the op spans.
        dims: i32,
        /// Per-pair wavelengths `[dims/2]`, +inf for pairs that do not rotate.
        freqs: Array,
    },
}

impl Rope {
    /// Builds the RoPE of a layer with head width `head_dim`.
    pub fn new(spec: &RopeSpec, head_dim: usize, rotary_dims: usize) -> Result<Rope> {
        let dims = head_dim as i32;
        Ok(match spec.rope_type {
            RopeType::Default => Rope::Default { dims, base: spec.theta },
            RopeType::Proportional => {
                // exponents = arange(0, rotated, 2, f32) / D; freqs = factor * θ ** exponents
                let exps = Array::arange(0.0, rotary_dims as f64, 2.0, Dtype::F32)?.div_scalar(head_dim as f64)?;
                let powed = Array::scalar(spec.theta as f64, Dtype::F32)?.power(&exps)?;
                let rotated = powed.mul_scalar(spec.factor as f64)?;
                let rest = Array::full(&[((head_dim - rotary_dims) / 2) as i32], f64::INFINITY, Dtype::F32)?;
                let freqs = concatenate(&[&rotated, &rest], 0)?;
                freqs.eval()?;
                Rope::Proportional { dims, freqs }
            }
        })
    }

    /// The rotation's inverse frequencies, one per rotated pair // `[dims / 2]` f32: position p
    /// turns pair i by `p · inv[i]` (zero for the pairs a proportional RoPE leaves alone). What
    /// the fused row node (`mlx_core::row_layer::qkv`) rotates with.
    pub fn inv_freqs(&self) -> Result<Array> {
        Ok(match self {
            Rope::Default { dims, base } => {
                let half = (*dims / 2).max(0) as usize;
                let inv: Vec<f32> =
                    (0..half).map(|i| (f64::from(*base)).powf(-2.0 * i as f64 / f64::from(*dims)) as f32).collect();
                Array::from_slice(&inv, &[half as i32])?
            }
            Rope::Proportional { freqs, .. } => {
                let inv = Array::scalar(1.0, Dtype::F32)?.divide(freqs)?;
                inv.eval()?;
                inv
            }
        })
    }

    /// Rotates x `[B, H, 1, D]` with entry b at position `positions[b]` (`[B]` int32).
    pub fn apply_at(&self, x: &Array, positions: &Array) -> Result<Array> {
        Ok(match self {
            Rope::Default { dims, base } => {
                fast::rope_offsets(x, *dims, false, RopeFreqs::Base(*base), 1.0, positions)?
            }
            Rope::Proportional { dims, freqs } => {
                fast::rope_offsets(x, *dims, false, RopeFreqs::Explicit(freqs), 1.0, positions)?
            }
        })
    }

    /// Rotates x `[B, H, L, D]` for positions `offset..offset+L`.
    pub fn apply(&self, x: &Array, offset: i32) -> Result<Array> {
        Ok(match self {
            Rope::Default { dims, base } => fast::rope(x, *dims, false, RopeFreqs::Base(*base), 1.0, offset)?,
            Rope::Proportional { dims, freqs } => fast::rope(x, *dims, false, RopeFreqs::Explicit(freqs), 1.0, offset)?,
        })
    }
}
