//! The per-request context K/V cache of the DeepSpec drafter (docs/architecture.md,
//! "Drafters").
//!
//! Invariants:
//! - `len` = committed context rows; row `i` sits at absolute position `i`.
//! - Each layer holds K (k_norm'd, roped at its absolute position) and V (weightless norm, no
//!   rope) // `[1, nKv, len, hd]`. Rows are projected exactly once, when they are committed:
//!   RMSNorm acts per row over head_dim and RoPE per absolute position, so caching post-norm,
//!   post-rope rows equals re-projecting the whole context every round.
//! - Only committed rows (anchor + accepted drafts) ever enter; rejected tips never do.

use mlx_core::Array;

use super::model::DeepSpecModel;
use crate::drafters::context_cache::{ContextCache, LayerKv};
use crate::error::{Error, Result};

/// The DeepSpec drafter's context: K (k_norm'd, roped at absolute positions) and V (weightless
/// norm, not roped) per layer.
pub type ContextKv = ContextCache;

/// Checks and projects tapped rows // `[1, k, taps·H]` into every layer's K/V at positions
/// start..start+k (nothing is written yet).
pub(crate) fn project_rows(
    model: &DeepSpecModel,
    rows: &Array,
    k: usize,
    start: usize,
    op: &str,
) -> Result<Vec<LayerKv>> {
    check_rows(model, rows, k, op)?;
    if k == 0 {
        return Ok(vec![]);
    }
    let projected = model.project_context(rows)?; // [1, k, H]
    model.context_kv(&projected, start)
}

/// Rows must be `[1, k, taps·H]` (shape metadata only; no host read).
fn check_rows(model: &DeepSpecModel, rows: &Array, k: usize, op: &str) -> Result<()> {
    let want = [1, k as i32, model.cfg.context_width() as i32];
    let got = rows.shape()?;
    if got != want {
        return Err(Error::Contract(format!(
            "deepspec {op}: tapped rows have shape {got:?}, expected {want:?} (1 × {k} rows × {} taps · {} hidden)",
            model.cfg.target_layer_ids.len(),
            model.cfg.hidden_size
        )));
    }
    Ok(())
}
