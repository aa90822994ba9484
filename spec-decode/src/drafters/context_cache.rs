//! A drafter's context K/V: per drafter layer, the keys and values of the committed context
//! rows, in a growing buffer (gemma4's `KvCache`). A commit appends the new rows; a draft writes
//! its block rows after the context, attends over `[context; block]` and trims them off again.
//! So a round neither re-projects nor copies the context, and only committed rows (anchor plus
//! accepted drafts) ever stay.

use gemma4::cache::KvCache;
use gemma4::LayerCache;
use mlx_core::Array;

use crate::error::{Error, Result};

/// One layer's keys and values // `[1, heads, L, hd]` each.
#[derive(Clone, Debug)]
pub struct LayerKv {
    /// Keys, `[1, heads, L, hd]`.
    pub k: Array,
    /// Values, `[1, heads, L, hd]`.
    pub v: Array,
}

/// The committed context of every drafter layer.
#[derive(Clone, Debug)]
pub struct ContextCache {
    layers: Vec<LayerCache>,
    /// Committed rows, including any before the stored ones (a windowed drafter is seeded with
    /// only the last rows of a long prompt).
    len: usize,
    /// Committed rows not stored: they precede the buffers' first row.
    skipped: usize,
}

impl ContextCache {
    /// An empty context for a drafter of `layers` layers.
    pub fn new(layers: usize) -> ContextCache {
        ContextCache { layers: (0..layers).map(|_| LayerCache::Full(KvCache::new())).collect(), len: 0, skipped: 0 }
    }

    /// An empty context whose first stored row will be committed row `skipped`: the rows before
    /// it count as committed but are not kept.
    pub fn after(layers: usize, skipped: usize) -> ContextCache {
        ContextCache { len: skipped, skipped, ..ContextCache::new(layers) }
    }

    /// Committed rows held in the buffers.
    pub fn stored(&self) -> usize {
        self.len - self.skipped
    }

    /// Committed rows.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no row is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `rows` committed rows, given as every layer's K/V of just those rows. All or
    /// nothing: if a layer's write fails, the layers already written are trimmed back.
    pub fn append(&mut self, kv: Vec<LayerKv>, rows: usize) -> Result<()> {
        if rows == 0 {
            return Ok(());
        }
        if kv.len() != self.layers.len() {
            return Err(Error::Contract(format!(
                "context append: {} layers of K/V for {} layers",
                kv.len(),
                self.layers.len()
            )));
        }
        for (i, l) in kv.iter().enumerate() {
            if let Err(e) = self.layers[i].update_and_fetch(&l.k, &l.v) {
                for written in &mut self.layers[..i] {
                    written.trim(rows)?;
                }
                return Err(e.into());
            }
        }
        self.len += rows;
        Ok(())
    }

    /// Layer `i`'s `[context; block]` K/V for one attention call // `[1, heads, len+γ, hd]`; the
    /// block rows leave the cache again before this returns.
    pub fn with_block(&mut self, i: usize, block: &LayerKv) -> Result<(Array, Array)> {
        let cache =
            self.layers.get_mut(i).ok_or_else(|| Error::Contract(format!("no context cache for drafter layer {i}")))?;
        let kv = cache.update_and_fetch(&block.k, &block.v)?;
        cache.trim(block.k.dim(2)? as usize)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(rows: i32, d: i32, fill: f64) -> LayerKv {
        let a = Array::full(&[1, 1, rows, d], fill, mlx_core::Dtype::F32).unwrap();
        LayerKv { k: a.clone(), v: a }
    }

    fn row_counts(c: &ContextCache) -> Vec<i32> {
        c.layers().unwrap().iter().map(|l| l.k.dim(2).unwrap()).collect()
    }

    #[test]
    fn a_failed_append_leaves_every_layer_as_it_was() {
        let mut c = ContextCache::new(2);
        c.append(vec![kv(2, 4, 1.0), kv(2, 4, 1.0)], 2).unwrap();
        // Layer 0's write succeeds, layer 1's fails (its rows are [1, 1, 1, 3] vs a [.., 4] buffer).
        assert!(c.append(vec![kv(1, 4, 2.0), kv(1, 3, 2.0)], 1).is_err());
        assert_eq!((c.len(), row_counts(&c)), (2, vec![2, 2]), "the written layer was trimmed back");
        c.append(vec![kv(1, 4, 3.0), kv(1, 4, 3.0)], 1).unwrap();
        assert_eq!((c.len(), row_counts(&c)), (3, vec![3, 3]));
        let last = c.layers().unwrap()[0].k.slice_axis(2, 2, 3).unwrap().to_f32_vec().unwrap();
        assert_eq!(last, vec![3.0; 4], "the rolled-back row was overwritten, not kept");
    }

    #[test]
    fn a_block_is_attended_then_dropped() {
        let mut c = ContextCache::new(1);
        c.append(vec![kv(3, 4, 1.0)], 3).unwrap();
        let (k, _) = c.with_block(0, &kv(2, 4, 9.0)).unwrap();
        assert_eq!(k.dim(2).unwrap(), 5, "[context; block]");
        assert_eq!((c.len(), row_counts(&c)), (3, vec![3]), "the block rows left again");
        assert!(c.with_block(1, &kv(2, 4, 9.0)).is_err(), "no layer 1");
    }
}
