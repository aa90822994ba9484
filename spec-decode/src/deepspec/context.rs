//! The per-request context K/V cache (spec §11.8, brief §3.5).
//!
//! Invariants:
//! - `len` = committed context rows; row `i` sits at absolute position `i`.
//! - Each layer holds K (k_norm'd, roped at its absolute position) and V (weightless norm, no
//!   rope) // [1, nKv, len, hd]. Rows are projected exactly once, when they are committed:
//!   RMSNorm acts per row over head_dim and RoPE per absolute position, so caching post-norm,
//!   post-rope rows equals re-projecting the whole context every round.
//! - Only committed rows (anchor + accepted drafts) ever enter; rejected tips never do.

use gemma4::cache::KvCache;
use gemma4::LayerCache;
use mlx_core::Array;

use super::model::{DeepSpecModel, LayerKv};
use crate::error::{Error, Result};

/// Cached context K/V for every drafter layer, each in a growing buffer (gemma4's `KvCache`):
/// commits append, and a draft writes its block rows after the context, attends, and trims
/// them off again, so no round copies the whole context.
#[derive(Clone, Debug)]
pub struct ContextKv {
    layers: Vec<LayerCache>,
    len: usize,
}

impl ContextKv {
    /// An empty context for a drafter of `layers` layers.
    pub fn new(layers: usize) -> ContextKv {
        ContextKv { layers: (0..layers).map(|_| LayerCache::Full(KvCache::new())).collect(), len: 0 }
    }

    /// Committed rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The committed K/V of every layer // [1, nKv, len, hd] (empty when `len == 0`).
    pub fn layers(&self) -> Result<Vec<LayerKv>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            if let Some((k, v)) = l.retained()? {
                out.push(LayerKv { k, v });
            }
        }
        Ok(out)
    }

    /// Projects tapped rows // [1, k, taps·H] at positions len..len+k and appends them.
    pub(crate) fn append(&mut self, model: &DeepSpecModel, rows: &Array, k: usize, op: &str) -> Result<()> {
        check_rows(model, rows, k, op)?;
        if k == 0 {
            return Ok(());
        }
        let ctx = model.project_context(rows)?; // [1, k, H]
        for (cache, kv) in self.layers.iter_mut().zip(model.context_kv(&ctx, self.len)?) {
            cache.update_and_fetch(&kv.k, &kv.v)?;
        }
        self.len += k;
        Ok(())
    }

    /// Layer `i`'s [context; block] K/V for one attention call // [1, nKv, len+γ, hd]; the
    /// block rows leave the cache again before this returns.
    pub(crate) fn with_block(&mut self, i: usize, block: &LayerKv) -> Result<(Array, Array)> {
        let cache = self.layers.get_mut(i).ok_or_else(|| Error::Contract(format!("deepspec: no context cache for layer {i}")))?;
        let kv = cache.update_and_fetch(&block.k, &block.v)?;
        cache.trim(block.k.dim(2).unwrap_or(0) as usize)?;
        Ok(kv)
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
