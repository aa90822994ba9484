//! mlx-lm's `KVCache`: a buffer grown in steps of 256 rows; reads return `[:offset]` views.

use mlx_core::row_cache::{CacheWrite, RowCopy, RowSource};
use mlx_core::{concatenate, Array};

use super::{CacheError, KvPieces, StepwiseWrite};

const STEP: i32 = 256;

/// Full-attention KV cache.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    keys: Option<Array>,   // [B, H, capacity, Dk]
    values: Option<Array>, // [B, H, capacity, Dv]
    offset: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }

    /// Tokens written.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Writes k, v `[B, H, S, D]` at `offset` and returns `[:offset]` (or the whole buffer when full).
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> mlx_core::Result<(Array, Array)> {
        super::check_intact(self.offset, self.keys.is_some())?;
        super::check_rows(k, v, self.keys.as_ref().zip(self.values.as_ref()))?;
        let prev = self.offset as i32;
        let s = k.dim(2)?;
        self.reserve(k, v, s)?;
        let end = prev + s;
        let (keys, values) = (self.keys.as_ref().unwrap_or(k), self.values.as_ref().unwrap_or(v));
        let keys = write_rows(keys, k, prev, end)?;
        let values = write_rows(values, v, prev, end)?;
        self.keys = Some(keys);
        self.values = Some(values);
        self.offset = end as usize;
        self.fetch()
    }

    /// Grows the buffers in 256-row steps (as mlx-lm does) until `s` more rows fit; k, v give
    /// the rows' batch, heads, width and dtype.
    fn reserve(&mut self, k: &Array, v: &Array, s: i32) -> mlx_core::Result<()> {
        let prev = self.offset as i32;
        let capacity = match &self.keys {
            Some(a) => a.dim(2)?,
            None => 0,
        };
        if self.keys.is_none() || prev + s > capacity {
            let (kshape, vshape) = (k.shape()?, v.shape()?);
            let n_steps = (STEP + s - 1) / STEP;
            let new_k = Array::zeros(&[kshape[0], kshape[1], n_steps * STEP, kshape[3]], k.dtype())?;
            let new_v = Array::zeros(&[vshape[0], vshape[1], n_steps * STEP, vshape[3]], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(mut ok), Some(mut ov)) => {
                    if prev % STEP != 0 {
                        ok = ok.slice_axis(2, 0, prev)?;
                        ov = ov.slice_axis(2, 0, prev)?;
                    }
                    self.keys = Some(concatenate(&[&ok, &new_k], 2)?);
                    self.values = Some(concatenate(&[&ov, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
        }
        Ok(())
    }

    /// Plans a stepwise write of `rows` rows (of `k`, `v` `[B, H, S, D]`, the rows of every session
    /// of a forward) for one node to carry out ([`mlx_core::row_cache`]): the rows go at the
    /// offset, in place, and row j of the write reads the first `offset + j + 1` rows, as
    /// [`Self::update_and_fetch_stepwise`] gives them. None while the cache is empty.
    #[allow(clippy::single_range_in_vec_init)] // lists of key ranges, often of one
    pub(super) fn begin_stepwise(
        &mut self,
        k: &Array,
        v: &Array,
        rows: usize,
    ) -> mlx_core::Result<Option<StepwiseWrite>> {
        if self.keys.is_none() {
            return Ok(None);
        }
        super::check_rows(k, v, self.keys.as_ref().zip(self.values.as_ref()))?;
        self.reserve(k, v, rows as i32)?;
        let (Some(keys), Some(values)) = (self.keys.take(), self.values.take()) else {
            return Err(mlx_core::Error::Host { op: "KvCache::begin_stepwise", detail: "buffer missing".into() });
        };
        let len = keys.dim(2)? as usize;
        let prev = self.offset;
        self.offset += rows;
        let copies = vec![
            RowCopy { dst: 0, src: RowSource::Old, start: 0, count: len },
            RowCopy { dst: prev, src: RowSource::New, start: 0, count: rows },
        ];
        Ok(Some(StepwiseWrite {
            write: CacheWrite { keys, values, rows, len, copies },
            reads: (prev + 1..=self.offset).map(|end| vec![0..end]).collect(),
        }))
    }

    /// Takes the buffers a planned write produced.
    pub(super) fn finish_stepwise(&mut self, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
    }

    /// Writes k, v `[B, H, S, D]` and returns, for each row, the K/V a one-token decode step at
    /// its position would attend to: every row up to and including it.
    pub fn update_and_fetch_stepwise(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<(Array, Array)>> {
        let prev = self.offset as i32;
        let (keys, values) = self.update_and_fetch(k, v)?;
        (prev + 1..=self.offset as i32)
            .map(|end| Ok((keys.slice_axis(2, 0, end)?, values.slice_axis(2, 0, end)?)))
            .collect()
    }

    /// [`Self::update_and_fetch_stepwise`] as [`KvPieces`] (always one piece: views of the buffer).
    pub fn update_and_fetch_stepwise_pieces(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<KvPieces>> {
        Ok(self.update_and_fetch_stepwise(k, v)?.into_iter().map(|kv| vec![kv]).collect())
    }

    fn fetch(&self) -> mlx_core::Result<(Array, Array)> {
        let (Some(k), Some(v)) = (&self.keys, &self.values) else {
            return Err(mlx_core::Error::Host { op: "KvCache::fetch", detail: "empty cache".into() });
        };
        let off = self.offset as i32;
        if off < k.dim(2)? {
            Ok((k.slice_axis(2, 0, off)?, v.slice_axis(2, 0, off)?))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    pub(super) fn check_trim(&self, n: usize) -> Result<(), CacheError> {
        if n > self.offset {
            return Err(CacheError::TrimBeyondLen { requested: n, len: self.offset });
        }
        Ok(())
    }

    /// mlx-lm's trim: only the offset moves; later writes overwrite the tail.
    pub(super) fn apply_trim(&mut self, n: usize) {
        self.offset -= n.min(self.offset);
    }

    pub(super) fn retained(&self) -> mlx_core::Result<Option<(Array, Array)>> {
        if self.offset == 0 {
            return Ok(None);
        }
        self.fetch().map(Some)
    }

    /// The same cache with buffers of its own (see [`super::Cache::detached`]).
    pub(super) fn detached(&self) -> mlx_core::Result<KvCache> {
        let own = |a: &Option<Array>| a.as_ref().map(super::own_buffer).transpose();
        Ok(KvCache { keys: own(&self.keys)?, values: own(&self.values)?, ..self.clone() })
    }

    pub(super) fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
}

/// `buf[..., start:end, :] = rows`
pub(super) fn write_rows(buf: &Array, rows: &Array, start: i32, end: i32) -> mlx_core::Result<Array> {
    let shape = buf.shape()?;
    let lo = [0, 0, start, 0];
    let hi = [shape[0], shape[1], end, shape[3]];
    buf.slice_update(rows, &lo, &hi, &[1, 1, 1, 1])
}
