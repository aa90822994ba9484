//! Attention masks exactly as mlx-lm builds them: the mode (none, the string
//! "causal", or a bool array) is part of kernel selection, so it is reproduced, not simplified.

use mlx_core::Array;

use crate::cache::LayerCache;
use crate::error::Result;

/// A mask for one forward, shared by every layer of a kind.
#[derive(Clone, Debug)]
pub enum AttnMask {
    /// No mask: every query attends to every key (a single decode step).
    None,
    /// Causal over the fused query/key positions, left to MLX's built-in causal mask.
    Causal,
    /// Bool `[L, S]`: true = attend.
    Array(Array),
}

impl AttnMask {
    /// The mask of query rows `from..to` only: causal masks are aligned to the last keys, so a
    /// tail of the queries keeps them; an explicit mask keeps those rows.
    pub fn query_rows(self, from: i32, to: i32) -> Result<AttnMask> {
        Ok(match self {
            AttnMask::Array(m) => AttnMask::Array(m.slice_axis(0, from, to)?),
            other => other,
        })
    }

    /// As the fused-attention argument.
    pub fn as_fast(&self) -> mlx_core::fast::Mask<'_> {
        match self {
            AttnMask::None => mlx_core::fast::Mask::None,
            AttnMask::Causal => mlx_core::fast::Mask::Causal,
            AttnMask::Array(a) => mlx_core::fast::Mask::Array(a),
        }
    }
}

/// base.py `create_causal_mask(n, offset, window)`: query i (absolute offset + i) sees key j
/// iff j ≤ offset + i and, with a window, offset + i < j + window. // `[n, offset + n]`
pub fn causal_window_mask(n: usize, offset: usize, window: Option<usize>) -> Result<Array> {
    let cols = offset + n;
    let mut m = Vec::with_capacity(n * cols);
    for i in 0..n {
        let q = offset + i;
        for j in 0..cols {
            m.push(q >= j && window.is_none_or(|w| q < j + w));
        }
    }
    Ok(Array::from_slice(&m, &[n as i32, cols as i32])?)
}

/// The mask for `n` new tokens of full-attention layers: `KVCache.make_mask(N)` without a
/// window depends on N alone, with or without a cache.
pub fn full_mask(n: usize) -> AttnMask {
    if n == 1 {
        AttnMask::None
    } else {
        AttnMask::Causal
    }
}

/// The mask for `n` new tokens of sliding layers with window `window`.
pub fn sliding_mask(n: usize, cache: Option<&LayerCache>, window: usize) -> Result<AttnMask> {
    match cache {
        Some(LayerCache::Rotating(c)) => {
            if n == 1 {
                // The window equals max_size, so eviction alone enforces it.
                return Ok(AttnMask::None);
            }
            let o = (c.max_size() - 1).min(c.offset());
            if o + n > window {
                Ok(AttnMask::Array(causal_window_mask(n, o, Some(window))?))
            } else {
                Ok(AttnMask::Causal)
            }
        }
        Some(LayerCache::Full(c)) => Ok(AttnMask::Array(causal_window_mask(n, c.offset(), Some(window))?)),
        None => {
            if n == 1 {
                Ok(AttnMask::None)
            } else if n > window {
                Ok(AttnMask::Array(causal_window_mask(n, 0, Some(window))?))
            } else {
                Ok(AttnMask::Causal)
            }
        }
    }
}
