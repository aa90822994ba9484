//! AdamW (Loshchilov & Hutter): Adam on the gradient, weight decay applied to the weights
//! directly rather than through the gradient, with bias-corrected moments.
//!
//! Per parameter w with gradient g at step t (1-based) and learning rate lr:
//!   m ← β1·m + (1 − β1)·g,   v ← β2·v + (1 − β2)·g²
//!   w ← w·(1 − lr·λ) − lr · (m / (1 − β1ᵗ)) / (√(v / (1 − β2ᵗ)) + ε)
//! Moments are f32 whatever the parameter dtype; the update is computed in f32 and cast back.

use mlx_core::{Array, Dtype};

use crate::error::{Error, Result};

/// Hyper-parameters of [`AdamW`].
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Decay rate of the first-moment (mean) estimate.
    pub beta1: f64,
    /// Decay rate of the second-moment (uncentred variance) estimate.
    pub beta2: f64,
    /// Added to the square root of the second moment, for stability.
    pub eps: f64,
    /// Decoupled weight decay λ (0 disables it).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// AdamW state for a fixed list of parameters.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// The hyper-parameters.
    pub config: AdamWConfig,
    /// Updates taken so far.
    pub step: u64,
    /// First moments, one per parameter, f32.
    pub m: Vec<Array>,
    /// Second moments, one per parameter, f32.
    pub v: Vec<Array>,
}

impl AdamW {
    /// Zero moments for `params`.
    pub fn new(config: AdamWConfig, params: &[Array]) -> Result<AdamW> {
        let zeros = |p: &Array| Array::zeros(&p.shape()?, Dtype::F32);
        let m = params.iter().map(zeros).collect::<mlx_core::Result<Vec<_>>>()?;
        let v = params.iter().map(zeros).collect::<mlx_core::Result<Vec<_>>>()?;
        Ok(AdamW { config, step: 0, m, v })
    }

    /// One update with learning rate `lr`; returns the new parameters (lazy: evaluate them
    /// together with [`AdamW::state_arrays`] once per step).
    pub fn step(&mut self, params: &[Array], grads: &[Array], lr: f64) -> Result<Vec<Array>> {
        if params.len() != grads.len() || params.len() != self.m.len() {
            return Err(Error::Mismatch {
                what: "adamw",
                detail: format!("{} parameters, {} gradients, {} moments", params.len(), grads.len(), self.m.len()),
            });
        }
        let c = &self.config;
        let t = self.step + 1;
        let bias1 = 1.0 - c.beta1.powf(t as f64);
        let bias2 = 1.0 - c.beta2.powf(t as f64);
        let mut updated = Vec::with_capacity(params.len());
        for (i, (w, g)) in params.iter().zip(grads).enumerate() {
            if w.shape()? != g.shape()? {
                return Err(Error::Mismatch {
                    what: "adamw",
                    detail: format!("parameter {i} has shape {:?} but its gradient {:?}", w.shape()?, g.shape()?),
                });
            }
            let g = g.astype(Dtype::F32)?;
            let m = self.m[i].mul_scalar(c.beta1)?.add(&g.mul_scalar(1.0 - c.beta1)?)?;
            let v = self.v[i].mul_scalar(c.beta2)?.add(&g.square()?.mul_scalar(1.0 - c.beta2)?)?;
            let denom = v.div_scalar(bias2)?.sqrt()?.add_scalar(c.eps)?;
            let step = m.div_scalar(bias1)?.divide(&denom)?.mul_scalar(lr)?;
            let w32 = w.astype(Dtype::F32)?;
            let decayed = if c.weight_decay != 0.0 { w32.mul_scalar(1.0 - lr * c.weight_decay)? } else { w32 };
            updated.push(decayed.subtract(&step)?.astype(w.dtype())?);
            self.m[i] = m;
            self.v[i] = v;
        }
        self.step = t;
        Ok(updated)
    }

    /// The moments, to evaluate with the parameters each step (MLX is lazy: a moment left
    /// unevaluated chains every step's graph onto the next).
    pub fn state_arrays(&self) -> impl Iterator<Item = &Array> {
        self.m.iter().chain(&self.v)
    }
}
