//! Global-norm gradient clipping: one L2 norm over every gradient; when it exceeds `max_norm`
//! all gradients are scaled by the same factor, so their direction is kept.

use mlx_core::{Array, Dtype};

use crate::error::Result;

/// Returns the clipped gradients and the norm before clipping (a 0-d f32 array; lazy).
pub fn clip_global_norm(grads: &[Array], max_norm: f64) -> Result<(Vec<Array>, Array)> {
    let mut total = Array::scalar(0.0, Dtype::F32)?;
    for g in grads {
        total = total.add(&g.astype(Dtype::F32)?.square()?.sum_all()?)?;
    }
    let norm = total.sqrt()?;
    // scale = min(1, max_norm / (norm + 1e-6)), computed on the device: no host read.
    let scale = Array::scalar(max_norm, Dtype::F32)?.divide(&norm.add_scalar(1e-6)?)?.minimum_scalar(1.0)?;
    let clipped = grads.iter().map(|g| Ok(g.multiply(&scale.astype(g.dtype())?)?)).collect::<Result<Vec<_>>>()?;
    Ok((clipped, norm))
}
