//! The dense GeGLU MLP: down(gelu_approx(gate(x)) · up(x)).

use mlx_core::Array;

use crate::error::Result;
use crate::linear::Linear;
use crate::weights::WeightMap;

/// Gated MLP.
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    /// Loads `prefix.mlp.*` of width `width`.
    pub fn load(wm: &mut WeightMap, prefix: &str, hidden: usize, width: usize) -> Result<Mlp> {
        let p = |n: &str| format!("{prefix}.{n}");
        Ok(Mlp {
            gate_proj: Linear::load(wm, &p("gate_proj"), width, hidden)?,
            up_proj: Linear::load(wm, &p("up_proj"), width, hidden)?,
            down_proj: Linear::load(wm, &p("down_proj"), hidden, width)?,
        })
    }

    /// `[B, L, H]` -> `[B, L, H]`
    /// (gate, up, down) when all three are plain f32 matrices.
    pub fn row_weights(&self) -> Option<[mlx_core::row_layer::RowWeight<'_>; 3]> {
        Some([self.gate_proj.row_weight()?, self.up_proj.row_weight()?, self.down_proj.row_weight()?])
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let g = gelu(&self.gate_proj.forward(x)?)?;
        let h = g.multiply(&self.up_proj.forward(x)?)?;
        self.down_proj.forward(&h)
    }
}

/// `gelu_approx`: on the CPU in f32 with the row kernels on, mlx-core's vectorized form (each
/// element's bits its own, so decode steps and verify rows agree; MLX's form takes a tanh per
/// element one at a time, 7 ms of an 8-row verify window on a 230M model); otherwise MLX's
/// composed form, as mlx-lm computes it (`MLX_CORE_ROW_LINEAR=0` for the parity gate).
pub fn gelu(x: &Array) -> Result<Array> {
    Ok(mlx_core::blas::gelu(x)?)
}
