//! A drafter's context K/V: per drafter layer, the keys and values of the committed context
//! rows, in a growing buffer (gemma4's `KvCache`). A commit appends the new rows; a draft writes
//! its block rows after the context, attends over [context; block] and trims them off again.
//! So a round neither re-projects nor copies the context, and only committed rows (anchor plus
//! accepted drafts) ever stay.

use gemma4::cache::KvCache;
use gemma4::LayerCache;
use mlx_core::Array;

use crate::error::{Error, Result};

/// One layer's keys and values // [1, heads, L, hd] each.
#[derive(Clone, Debug)]
pub struct LayerKv {
    pub k: Array,
    pub v: Array,
}

/// The committed context of every drafter layer.
#[derive(Clone, Debug)]
pub struct ContextCache {
    layers: Vec<LayerCache>,
    len: usize,
}

impl ContextCache {
    /// An empty context for a drafter of `layers` layers.
    pub fn new(layers: usize) -> ContextCache {
        ContextCache { layers: (0..layers).map(|_| LayerCache::Full(KvCache::new())).collect(), len: 0 }
    }

    /// Committed rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `rows` committed rows, given as every layer's K/V of just those rows. A failed
    /// append can leave layers uneven: callers drop the context on error (fail closed).
    pub fn append(&mut self, kv: Vec<LayerKv>, rows: usize) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        if kv.len() != self.layers.len() {
            return Err(Error::Contract(format!("context append: {} layers of K/V for {} layers", kv.len(), self.layers.len())));
        }
        for (cache, l) in self.layers.iter_mut().zip(kv) {
            cache.update_and_fetch(&l.k, &l.v)?;
        }
        self.len += rows;
        Ok(())
    }

    /// Layer `i`'s [context; block] K/V for one attention call // [1, heads, len+γ, hd]; the
    /// block rows leave the cache again before this returns.
    pub fn with_block(&mut self, i: usize, block: &LayerKv) -> Result<(Array, Array)> {
        let cache = self.layers.get_mut(i).ok_or_else(|| Error::Contract(format!("no context cache for drafter layer {i}")))?;
        let kv = cache.update_and_fetch(&block.k, &block.v)?;
        cache.trim(block.k.dim(2).unwrap_or(0) as usize)?;
        Ok(kv)
    }

    /// The committed K/V of every layer (empty when nothing is committed).
    pub fn layers(&self) -> Result<Vec<LayerKv>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            if let Some((k, v)) = l.retained()? {
                out.push(LayerKv { k, v });
            }
        }
        Ok(out)
    }
}
