//! KV caches, replicating mlx-lm's `KVCache` and `RotatingKVCache` buffer layouts exactly:
//! SDPA sums over keys in buffer order, so the layout is part of the numerics.
//!
//! Rollback (`trim`) is all-or-nothing across layers: `can_trim` checks every layer before
//! `trim` changes any. A rotating cache can always be trimmed by up to the size of its last
//! multi-token write, even after the ring wrapped (the speculative verify case); other
//! trims are legal only before the ring wraps, as in mlx-lm.

mod full;
mod rotating;

pub use full::KvCache;
pub use rotating::RotatingKvCache;

use mlx_core::{concatenate, Array};

use crate::config::{LayerKind, TextConfig};

/// Why a rollback was refused. Nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// Asked to drop more tokens than the cache holds.
    #[error("cannot trim {requested} tokens from a cache holding {len}")]
    TrimBeyondLen {
        /// Tokens asked to drop.
        requested: usize,
        /// Tokens the cache holds.
        len: usize,
    },
    /// A sliding-window cache cannot roll back past what its last write overwrote in the ring.
    #[error(
        "cannot trim {requested} tokens from a sliding-window cache of window {window} at offset {offset}: \
         the ring has wrapped, the last write was {last_write} tokens and at most {rollback_left} of them may still be rolled back"
    )]
    TrimAfterWrap {
        /// Tokens asked to drop.
        requested: usize,
        /// Tokens written so far (the absolute position).
        offset: usize,
        /// The ring's size, in tokens.
        window: usize,
        /// Tokens of the last write.
        last_write: usize,
        /// Tokens that may still be dropped.
        rollback_left: usize,
    },
}

/// One query row's keys and values as views of a cache buffer, attended as their concatenation
/// along the rows // each (`[B, H, L_s, D]`, same)
pub type KvPieces = Vec<(Array, Array)>;

/// A stepwise write planned on the host for [`mlx_core::row_cache::attend_and_write`]: the
/// cache's buffers and how to rebuild them, and each new row's key ranges in that buffer (the
/// keys, in the order, a one-token decode step at its position attends to). The cache's offset
/// has moved; it takes the rebuilt buffers with [`LayerCache::finish_stepwise`].
#[derive(Debug)]
pub struct StepwiseWrite {
    /// The buffers and their rebuild.
    pub write: mlx_core::row_cache::CacheWrite,
    /// Each new row's key ranges in the rebuilt buffers, in attention order.
    pub reads: Vec<Vec<std::ops::Range<usize>>>,
}

/// A row's pieces as one K/V pair (a copy only when there are several).
pub fn join_pieces(mut pieces: KvPieces) -> mlx_core::Result<(Array, Array)> {
    if pieces.len() == 1 {
        return Ok(pieces.remove(0));
    }
    let ks: Vec<&Array> = pieces.iter().map(|(k, _)| k).collect();
    let vs: Vec<&Array> = pieces.iter().map(|(_, v)| v).collect();
    Ok((concatenate(&ks, 2)?, concatenate(&vs, 2)?))
}

/// Refuses a write to a cache that holds tokens but no buffers: a stepwise forward that failed
/// between planning a write and building its node ([`LayerCache::begin_stepwise`]) leaves one so,
/// and writing on would attend over fresh zero rows.
fn check_intact(offset: usize, has_buffers: bool) -> mlx_core::Result<()> {
    if offset > 0 && !has_buffers {
        return Err(mlx_core::Error::Host {
            op: "cache write",
            detail: format!(
                "the cache holds {offset} tokens but lost its buffers in a failed forward; start the request again"
            ),
        });
    }
    Ok(())
}

/// `a`'s values in a new buffer (`a · 1` keeps every value's bits, ±0 and NaN included).
fn own_buffer(a: &Array) -> mlx_core::Result<Array> {
    a.mul_scalar(1.0)
}

/// Checks that k and v are `[B, H, S, D]` rows to write, with S ≥ 1, the same B, H and S, and
/// the B, H and D of the buffers already held, so a bad write is refused before anything changes.
fn check_rows(k: &Array, v: &Array, held: Option<(&Array, &Array)>) -> mlx_core::Result<()> {
    let (ks, vs) = (k.shape()?, v.shape()?);
    let bad = |detail: String| Err(mlx_core::Error::Host { op: "cache write", detail });
    if ks.len() != 4 || vs.len() != 4 || ks[..3] != vs[..3] || ks[2] < 1 {
        return bad(format!("keys and values must be [B, H, S >= 1, D] with equal B, H, S; got {ks:?} and {vs:?}"));
    }
    if let Some((hk, hv)) = held {
        let same = |new: &[i32], old: Vec<i32>| old.len() == 4 && (new[0], new[1], new[3]) == (old[0], old[1], old[3]);
        if !same(&ks, hk.shape()?) || !same(&vs, hv.shape()?) {
            return bad(format!(
                "rows {ks:?} / {vs:?} do not match the cached [B, H, _, D] of {:?} / {:?}",
                hk.shape()?,
                hv.shape()?
            ));
        }
    }
    Ok(())
}

/// The cache of one donor layer.
#[derive(Clone, Debug)]
pub enum LayerCache {
    /// A growing cache for a full-attention layer.
    Full(KvCache),
    /// A ring buffer of `sliding_window` tokens for a sliding layer.
    Rotating(RotatingKvCache),
}

impl LayerCache {
    /// Writes k, v `[B, H, S, D]` and returns the K/V the layer attends to.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> mlx_core::Result<(Array, Array)> {
        match self {
            LayerCache::Full(c) => c.update_and_fetch(k, v),
            LayerCache::Rotating(c) => c.update_and_fetch(k, v),
        }
    }

    /// Writes k, v `[B, H, S, D]` and returns per row the K/V a one-token decode step at that
    /// row's position would attend to (keys, order and count), for bit-exact verification.
    pub fn update_and_fetch_stepwise(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<(Array, Array)>> {
        match self {
            LayerCache::Full(c) => c.update_and_fetch_stepwise(k, v),
            LayerCache::Rotating(c) => c.update_and_fetch_stepwise(k, v),
        }
    }

    /// [`Self::update_and_fetch_stepwise`] with each row's K/V as uncopied views of the buffer.
    pub fn update_and_fetch_stepwise_pieces(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<KvPieces>> {
        match self {
            LayerCache::Full(c) => c.update_and_fetch_stepwise_pieces(k, v),
            LayerCache::Rotating(c) => c.update_and_fetch_stepwise_pieces(k, v),
        }
    }

    /// Plans [`Self::update_and_fetch_stepwise_pieces`] of `rows` rows for one node to carry
    /// out, leaving the same layout and state (the rows' batch, heads, width and dtype are those
    /// of `k` and `v`, the new rows of every session of a forward). None, and nothing changed,
    /// while the cache is empty.
    pub fn begin_stepwise(&mut self, k: &Array, v: &Array, rows: usize) -> mlx_core::Result<Option<StepwiseWrite>> {
        match self {
            LayerCache::Full(c) => c.begin_stepwise(k, v, rows),
            LayerCache::Rotating(c) => c.begin_stepwise(k, v, rows),
        }
    }

    /// Takes the buffers (keys, values) that carried out the write [`Self::begin_stepwise`] planned.
    pub fn finish_stepwise(&mut self, keys: Array, values: Array) {
        match self {
            LayerCache::Full(c) => c.finish_stepwise(keys, values),
            LayerCache::Rotating(c) => c.finish_stepwise(keys, values),
        }
    }

    /// Whether the cache holds buffers (it has been written).
    pub fn is_written(&self) -> bool {
        !self.state().is_empty()
    }

    /// Tokens written so far (the RoPE offset of the next token).
    pub fn offset(&self) -> usize {
        match self {
            LayerCache::Full(c) => c.offset(),
            LayerCache::Rotating(c) => c.offset(),
        }
    }

    /// Whether `trim(n)` would succeed.
    pub fn check_trim(&self, n: usize) -> Result<(), CacheError> {
        match self {
            LayerCache::Full(c) => c.check_trim(n),
            LayerCache::Rotating(c) => c.check_trim(n),
        }
    }

    /// Drops the newest `n` tokens, or refuses and changes nothing.
    pub fn trim(&mut self, n: usize) -> crate::Result<()> {
        self.check_trim(n)?;
        Ok(self.apply_trim(n)?)
    }

    fn apply_trim(&mut self, n: usize) -> mlx_core::Result<()> {
        match self {
            LayerCache::Full(c) => {
                c.apply_trim(n);
                Ok(())
            }
            LayerCache::Rotating(c) => c.apply_trim(n),
        }
    }

    /// The retained rows in temporal order (for tests and debugging; does not mutate).
    pub fn retained(&self) -> mlx_core::Result<Option<(Array, Array)>> {
        match self {
            LayerCache::Full(c) => c.retained(),
            LayerCache::Rotating(c) => c.retained(),
        }
    }

    fn detached(&self) -> mlx_core::Result<LayerCache> {
        Ok(match self {
            LayerCache::Full(c) => LayerCache::Full(c.detached()?),
            LayerCache::Rotating(c) => LayerCache::Rotating(c.detached()?),
        })
    }

    /// The arrays that hold the cache state, for `eval`.
    pub fn state(&self) -> Vec<&Array> {
        match self {
            LayerCache::Full(c) => c.state(),
            LayerCache::Rotating(c) => c.state(),
        }
    }
}

/// One cache per donor (non-KV-shared) layer, in layer order.
#[derive(Clone, Debug)]
pub struct Cache {
    layers: Vec<LayerCache>,
}

impl Cache {
    /// mlx-lm's `make_cache`: `KVCache` for full layers, `RotatingKVCache(sliding_window)` for
    /// sliding ones, none for KV-shared layers.
    pub fn new(cfg: &TextConfig) -> Cache {
        let layers = cfg.layers[..cfg.first_kv_shared]
            .iter()
            .map(|l| match l.kind {
                LayerKind::Full => LayerCache::Full(KvCache::new()),
                LayerKind::Sliding => LayerCache::Rotating(RotatingKvCache::new(cfg.sliding_window)),
            })
            .collect();
        Cache { layers }
    }

    /// Number of layer caches.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True if there are no layer caches.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Tokens written (equal across layers).
    pub fn offset(&self) -> usize {
        self.layers.first().map(LayerCache::offset).unwrap_or(0)
    }

    /// Cache `i`.
    pub fn layer(&self, i: usize) -> Option<&LayerCache> {
        self.layers.get(i)
    }

    pub(crate) fn layer_mut(&mut self, i: usize) -> Option<&mut LayerCache> {
        self.layers.get_mut(i)
    }

    /// Whether every layer can drop its newest `n` tokens.
    pub fn can_trim(&self, n: usize) -> Result<(), CacheError> {
        self.layers.iter().try_for_each(|l| l.check_trim(n))
    }

    /// Drops the newest `n` tokens from every layer, or from none (returns the refusal).
    pub fn trim(&mut self, n: usize) -> crate::Result<()> {
        self.can_trim(n)?;
        for l in &mut self.layers {
            l.apply_trim(n)?;
        }
        Ok(())
    }

    /// The same cache with buffers of its own, evaluated. A clone shares its buffers, so its
    /// first write copies every buffer it touches (MLX updates a buffer in place only when
    /// nothing else holds it); a detached copy is written in place, as the cache of a running
    /// request is. What timings of single forwards run on (`dspark profile`).
    pub fn detached(&self) -> mlx_core::Result<Cache> {
        let c = Cache { layers: self.layers.iter().map(LayerCache::detached).collect::<mlx_core::Result<_>>()? };
        c.eval()?;
        Ok(c)
    }

    /// Evaluates the cache buffers (mlx-lm evals cache state after each prefill chunk).
    pub fn eval(&self) -> mlx_core::Result<()> {
        let state: Vec<&Array> = self.layers.iter().flat_map(|l| l.state()).collect();
        mlx_core::eval(&state)
    }
}
