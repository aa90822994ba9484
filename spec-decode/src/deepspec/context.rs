//! The per-request context K/V cache (spec §11.8, brief §3.5).
//!
//! Invariants:
//! - `len` = committed context rows; row `i` sits at absolute position `i`.
//! - Each layer holds K (k_norm'd, roped at its absolute position) and V (weightless norm, no
//!   rope) // [1, nKv, len, hd]. Rows are projected exactly once, when they are committed:
//!   RMSNorm acts per row over head_dim and RoPE per absolute position, so caching post-norm,
//!   post-rope rows equals re-projecting the whole context every round.
//! - Only committed rows (anchor + accepted drafts) ever enter; rejected tips never do.

use mlx_core::{concatenate, Array};

use super::model::{DeepSpecModel, LayerKv};
use crate::error::{Error, Result};

/// Cached context K/V for every drafter layer.
#[derive(Clone, Debug, Default)]
pub struct ContextKv {
    /// Empty while no row has been committed (a context of length 0).
    layers: Vec<LayerKv>,
    len: usize,
}

impl ContextKv {
    /// Committed rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Per-layer K/V (empty when `len == 0`).
    pub fn layers(&self) -> &[LayerKv] {
        &self.layers
    }

    /// Projects tapped rows // [1, k, taps·H] at positions len..len+k and appends them.
    pub(crate) fn append(&mut self, model: &DeepSpecModel, rows: &Array, k: usize, op: &str) -> Result<()> {
        check_rows(model, rows, k, op)?;
        if k == 0 {
            return Ok(());
        }
        let ctx = model.project_context(rows)?; // [1, k, H]
        let fresh = model.context_kv(&ctx, self.len)?;
        self.layers = if self.layers.is_empty() {
            fresh
        } else {
            self.layers
                .iter()
                .zip(fresh)
                .map(|(old, new)| {
                    Ok(LayerKv { k: concatenate(&[&old.k, &new.k], 2)?, v: concatenate(&[&old.v, &new.v], 2)? })
                })
                .collect::<Result<Vec<_>>>()?
        };
        self.len += k;
        Ok(())
    }
}

/// Rows must be [1, k, taps·H] (shape metadata only; no host read).
fn check_rows(model: &DeepSpecModel, rows: &Array, k: usize, op: &str) -> Result<()> {
    let want = [1, k as i32, model.cfg.context_width() as i32];
    let got = rows.shape();
    if got != want {
        return Err(Error::Contract(format!(
            "deepspec {op}: tapped rows have shape {got:?}, expected {want:?} (1 × {k} rows × {} taps · {} hidden)",
            model.cfg.target_layer_ids.len(),
            model.cfg.hidden_size
        )));
    }
    Ok(())
}
