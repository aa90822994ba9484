//! Linear layers and embedding tables, dense or quantized as a value (not a second model file).
//! Both read through `LinearWeights`, so every model (targets and drafters) shares one
//! implementation of dense and MLX-affine-quantized products.

use mlx_core::Array;

use crate::error::Result;
use crate::weights::{LinearWeights, WeightMap};

/// `nn.Linear` without bias, or `nn.QuantizedLinear`.
#[derive(Clone, Debug)]
pub struct Linear {
    w: LinearWeights,
}

impl Linear {
    /// Loads `module.weight` (and `.scales`/`.biases` when quantized) for a `[out, in]` layer.
    pub fn load(wm: &mut WeightMap, module: &str, out: usize, inp: usize) -> Result<Linear> {
        Ok(Linear { w: wm.linear(module, out, inp)? })
    }

    /// `x @ Wᵀ` // `[.., in]` -> `[.., out]`
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.w.matmul_t(x)
    }

    /// The `[out, in]` matrix as the fused row nodes read it (f32, bf16 read as f32, or 8/4-bit
    /// packed), if they can.
    pub fn row_weight(&self) -> Option<mlx_core::row_layer::RowWeight<'_>> {
        self.w.row_weight()
    }
}

/// `nn.Embedding` or `nn.QuantizedEmbedding` (gather, then dequantize).
#[derive(Clone, Debug)]
pub struct Embedding {
    w: LinearWeights,
}

impl Embedding {
    /// Loads a `[rows, dims]` table.
    pub fn load(wm: &mut WeightMap, module: &str, rows: usize, dims: usize) -> Result<Embedding> {
        Ok(Embedding { w: wm.linear(module, rows, dims)? })
    }

    /// Rows at `ids` // `[B, L]` -> `[B, L, dims]`
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        self.w.gather(ids)
    }

    /// The tied head: `x @ Eᵀ` // `[.., dims]` -> `[.., rows]`
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        self.w.matmul_t(x)
    }
}
