//! mlx-lm's `RotatingKVCache(max_size, keep=0)`, plus an exact rollback right
//! after a multi-token write that also works once the ring has wrapped.
//!
//! Layout rules, which decide what SDPA sees:
//! - a multi-token write (prefill chunk, verify batch) reorders the buffer temporally, keeps at
//!   most `max_size − 1` old rows and appends the new ones: the result can be longer than the
//!   window, and the sliding mask hides what each query must not see;
//! - a single-token write grows the buffer in 256-row steps up to `max_size`, then overwrites
//!   the oldest row in ring order and returns the whole ring.
//!
//! Rollback invariant: right after a multi-token write of S rows the buffer is in temporal
//! order and ends with exactly those S rows, so dropping its last n ≤ S − 1 rows physically
//! leaves every row any later query may see (`spec_budget` tracks how many may still go).
//! Other trims are only legal before the ring wraps (`offset < max_size`), as in mlx-lm.
//!
//! Stepwise writes (verification): the rows are stored like a multi-token write, but each row
//! is given the window a one-token decode step at its position would attend to, in the ring
//! order that step would see. Token-at-a-time decoding puts position q in slot
//! (q − phase) mod max_size, where `phase` is fixed by its first single-token write (that
//! position, or max_size if the ring had not filled yet), so the order is a function of q alone
//! and rolled-back rows never disturb it.

use std::ops::Range;

use mlx_core::row_cache::{CacheWrite, RowCopy, RowSource};
use mlx_core::{concatenate, Array};

use super::full::write_rows;
use super::{CacheError, KvPieces, StepwiseWrite};

const STEP: i32 = 256;

/// Sliding-window KV cache.
#[derive(Clone, Debug)]
pub struct RotatingKvCache {
    keys: Option<Array>,   // [B, H, buf, Dk]
    values: Option<Array>, // [B, H, buf, Dv]
    offset: usize,
    idx: i32,
    max_size: i32,
    spec_budget: usize,
    last_write: usize, // rows of the last write (for error messages)
    /// The position token-at-a-time decoding puts (or would put) in slot 0; None until the first
    /// single-token or stepwise write after a multi-token one.
    phase: Option<usize>,
}

impl RotatingKvCache {
    /// An empty cache of window `max_size`.
    pub fn new(max_size: usize) -> RotatingKvCache {
        RotatingKvCache {
            keys: None,
            values: None,
            offset: 0,
            idx: 0,
            max_size: max_size as i32,
            spec_budget: 0,
            last_write: 0,
            phase: None,
        }
    }

    /// Tokens written.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The window.
    pub fn max_size(&self) -> usize {
        self.max_size as usize
    }

    /// Rows in the buffer.
    pub fn buffer_len(&self) -> mlx_core::Result<usize> {
        Ok(match &self.keys {
            Some(k) => k.dim(2)? as usize,
            None => 0,
        })
    }

    /// Writes k, v `[B, H, S, D]`; S == 1 takes the in-place path, S > 1 the concat path.
    pub fn update_and_fetch(&mut self, k: &Array, v: &Array) -> mlx_core::Result<(Array, Array)> {
        super::check_intact(self.offset, self.keys.is_some())?;
        super::check_rows(k, v, self.keys.as_ref().zip(self.values.as_ref()))?;
        if k.dim(2)? == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    fn temporal_order(&self, buf: &Array) -> mlx_core::Result<Array> {
        let len = buf.dim(2)?;
        if self.idx == len {
            Ok(buf.clone())
        } else if (self.idx as usize) < self.offset {
            concatenate(&[&buf.slice_axis(2, self.idx, len)?, &buf.slice_axis(2, 0, self.idx)?], 2)
        } else {
            buf.slice_axis(2, 0, self.idx)
        }
    }

    /// Drops the oldest `trim` rows (keep = 0) and appends `append`.
    fn trim_front(trim: i32, buf: &Array, append: Option<&Array>) -> mlx_core::Result<Array> {
        let len = buf.dim(2)?;
        let kept = if trim > 0 { buf.slice_axis(2, trim, len)? } else { buf.clone() };
        match append {
            Some(a) => concatenate(&[&kept, a], 2),
            None => Ok(kept),
        }
    }

    fn update_concat(&mut self, k: &Array, v: &Array) -> mlx_core::Result<(Array, Array)> {
        let s = k.dim(2)?;
        match (self.keys.take(), self.values.take()) {
            (Some(ok), Some(ov)) => {
                let ok = self.temporal_order(&ok)?;
                let ov = self.temporal_order(&ov)?;
                self.idx = ok.dim(2)?;
                // At most max_size − 1 old rows, so every new token still sees a full window.
                let trim = self.idx - self.max_size + 1;
                self.keys = Some(Self::trim_front(trim, &ok, Some(k))?);
                self.values = Some(Self::trim_front(trim, &ov, Some(v))?);
            }
            _ => {
                self.keys = Some(k.clone());
                self.values = Some(v.clone());
            }
        }
        self.offset += s as usize;
        self.idx = self.buffer_len()? as i32;
        self.spec_budget = (s as usize).saturating_sub(1);
        self.last_write = s as usize;
        self.phase = None;
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok((k.clone(), v.clone())),
            _ => Err(mlx_core::Error::Host { op: "RotatingKvCache", detail: "empty after write".into() }),
        }
    }

    fn update_in_place(&mut self, k: &Array, v: &Array) -> mlx_core::Result<(Array, Array)> {
        let prev = self.offset as i32;
        let len = self.buffer_len()? as i32;
        if self.keys.is_none() || (prev >= len && len < self.max_size) {
            let new_size = STEP.min(self.max_size - prev);
            let (ks, vs) = (k.shape()?, v.shape()?);
            let new_k = Array::zeros(&[ks[0], ks[1], new_size, ks[3]], k.dtype())?;
            let new_v = Array::zeros(&[vs[0], vs[1], new_size, vs[3]], v.dtype())?;
            match (self.keys.take(), self.values.take()) {
                (Some(ok), Some(ov)) => {
                    self.keys = Some(concatenate(&[&ok, &new_k], 2)?);
                    self.values = Some(concatenate(&[&ov, &new_v], 2)?);
                }
                _ => {
                    self.keys = Some(new_k);
                    self.values = Some(new_v);
                }
            }
            self.idx = prev;
        }
        let (Some(mut keys), Some(mut values)) = (self.keys.take(), self.values.take()) else {
            return Err(mlx_core::Error::Host { op: "RotatingKvCache", detail: "buffer missing".into() });
        };
        let trim = keys.dim(2)? - self.max_size;
        if trim > 0 {
            keys = Self::trim_front(trim, &keys, None)?;
            values = Self::trim_front(trim, &values, None)?;
            self.idx = self.max_size;
        }
        if self.idx == self.max_size {
            self.idx = 0; // the ring wraps
            self.phase = Some(prev as usize);
        }
        let w = self.max_size as usize;
        self.phase.get_or_insert((prev as usize).max(w));
        keys = write_rows(&keys, k, self.idx, self.idx + 1)?;
        values = write_rows(&values, v, self.idx, self.idx + 1)?;
        self.offset += 1;
        self.idx += 1;
        self.spec_budget = 0;
        self.last_write = 1;
        let buf = keys.dim(2)?;
        let out = if (self.offset as i32) < buf {
            (keys.slice_axis(2, 0, self.offset as i32)?, values.slice_axis(2, 0, self.offset as i32)?)
        } else {
            (keys.clone(), values.clone())
        };
        self.keys = Some(keys);
        self.values = Some(values);
        Ok(out)
    }

    /// Writes k, v `[B, H, S, D]` and returns, for each of the S rows, the K/V `[B, H, ≤ window, D]`
    /// that a one-token decode step at that row's position would attend to: the same rows in
    /// the same ring order, so attention over them is bit-identical to token-at-a-time decoding.
    pub fn update_and_fetch_stepwise(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<(Array, Array)>> {
        self.update_and_fetch_stepwise_pieces(k, v)?.into_iter().map(super::join_pieces).collect()
    }

    /// [`Self::update_and_fetch_stepwise`] with each row's K/V as views of the buffer: one piece,
    /// or two where the ring has wrapped (attended as their concatenation), so nothing is copied.
    pub fn update_and_fetch_stepwise_pieces(&mut self, k: &Array, v: &Array) -> mlx_core::Result<Vec<KvPieces>> {
        super::check_intact(self.offset, self.keys.is_some())?;
        super::check_rows(k, v, self.keys.as_ref().zip(self.values.as_ref()))?;
        let prev = self.offset;
        let phase = *self.phase.get_or_insert(prev.max(self.max_size as usize));
        let (keys, values) = self.update_concat(k, v)?;
        self.phase = Some(phase);
        let first = self.offset - self.buffer_len()?; // position of buffer row 0
        let s = k.dim(2)? as usize;
        (prev..prev + s)
            .map(|q| {
                let ks = self.decode_view(&keys, q, phase, first)?;
                let vs = self.decode_view(&values, q, phase, first)?;
                Ok(ks.into_iter().zip(vs).collect())
            })
            .collect()
    }

    /// The rows a decode step at position `q` sees, from a temporal buffer starting at `first`:
    /// the last min(q + 1, window) positions, rotated so the one in slot 0 comes first (as one
    /// or two slices of the buffer, in order).
    fn decode_view(&self, buf: &Array, q: usize, phase: usize, first: usize) -> mlx_core::Result<Vec<Array>> {
        self.decode_ranges(q, phase, first)
            .into_iter()
            .map(|r| buf.slice_axis(2, r.start as i32, r.end as i32))
            .collect()
    }

    /// [`Self::decode_view`]'s buffer rows: one range, or two where the ring has wrapped.
    #[allow(clippy::single_range_in_vec_init)] // lists of key ranges, often of one
    fn decode_ranges(&self, q: usize, phase: usize, first: usize) -> Vec<Range<usize>> {
        let w = self.max_size as usize;
        let lo = (q + 1).saturating_sub(w);
        let row = |pos: usize| pos - first;
        if q + 1 < w {
            return vec![row(lo)..row(q + 1)];
        }
        let slot0 = lo + (phase + w - lo % w) % w;
        if slot0 == lo {
            vec![row(lo)..row(q + 1)]
        } else {
            vec![row(slot0)..row(q + 1), row(lo)..row(slot0)]
        }
    }

    /// Plans a stepwise write of `rows` rows (of `k`, `v` `[B, H, S, D]`, the rows of every session
    /// of a forward) for one node to carry out ([`mlx_core::row_cache`]), leaving the layout and
    /// state [`Self::update_and_fetch_stepwise_pieces`] leaves: the buffer in temporal order with
    /// at most `max_size − 1` old rows, then the new ones; each row reads its decode view. None
    /// while the cache is empty.
    #[allow(clippy::single_range_in_vec_init)] // lists of key ranges, often of one
    pub(super) fn begin_stepwise(
        &mut self,
        k: &Array,
        v: &Array,
        rows: usize,
    ) -> mlx_core::Result<Option<StepwiseWrite>> {
        let (Some(keys), Some(values)) = (self.keys.take(), self.values.take()) else {
            return Ok(None);
        };
        if let Err(e) = super::check_rows(k, v, Some((&keys, &values))) {
            (self.keys, self.values) = (Some(keys), Some(values));
            return Err(e);
        }
        let w = self.max_size as usize;
        let prev = self.offset;
        let phase = *self.phase.get_or_insert(prev.max(w));
        let (len, idx) = (keys.dim(2)? as usize, self.idx as usize);
        // The old rows in temporal order (`temporal_order`), less the oldest beyond max_size − 1.
        let temporal = if idx == len {
            vec![0..len]
        } else if idx < prev {
            vec![idx..len, 0..idx]
        } else {
            vec![0..idx]
        };
        let mut skip = temporal.iter().map(Range::len).sum::<usize>().saturating_sub(w - 1);
        let mut copies = Vec::new();
        let mut dst = 0;
        for r in temporal {
            let count = r.len().saturating_sub(skip);
            if count > 0 {
                copies.push(RowCopy { dst, src: RowSource::Old, start: r.end - count, count });
                dst += count;
            }
            skip = skip.saturating_sub(r.len());
        }
        copies.push(RowCopy { dst, src: RowSource::New, start: 0, count: rows });
        let len = dst + rows;
        self.offset += rows;
        self.idx = len as i32;
        self.spec_budget = rows.saturating_sub(1);
        self.last_write = rows;
        let first = self.offset - len;
        let reads = (prev..self.offset).map(|q| self.decode_ranges(q, phase, first)).collect();
        Ok(Some(StepwiseWrite { write: CacheWrite { keys, values, rows, len, copies }, reads }))
    }

    /// Takes the buffers a planned write produced.
    pub(super) fn finish_stepwise(&mut self, keys: Array, values: Array) {
        self.keys = Some(keys);
        self.values = Some(values);
    }

    /// mlx-lm's `is_trimmable`: the ring has not wrapped.
    pub fn is_trimmable(&self) -> bool {
        (self.offset as i32) < self.max_size
    }

    pub(super) fn check_trim(&self, n: usize) -> Result<(), CacheError> {
        if n > self.offset {
            return Err(CacheError::TrimBeyondLen { requested: n, len: self.offset });
        }
        if n == 0 || n <= self.spec_budget || self.is_trimmable() {
            return Ok(());
        }
        Err(CacheError::TrimAfterWrap {
            requested: n,
            offset: self.offset,
            window: self.max_size as usize,
            last_write: self.last_write,
            rollback_left: self.spec_budget,
        })
    }

    pub(super) fn apply_trim(&mut self, n: usize) -> mlx_core::Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n <= self.spec_budget {
            // Physically drop the rejected rows; the buffer stays temporal with idx == len.
            let keep = self.buffer_len()? as i32 - n as i32;
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                let (k, v) = (k.slice_axis(2, 0, keep)?, v.slice_axis(2, 0, keep)?);
                self.keys = Some(k);
                self.values = Some(v);
            }
            self.idx = keep;
            self.spec_budget -= n;
        } else {
            // mlx-lm's logical trim (valid before the wrap only; `check_trim` ensured it).
            self.idx -= n as i32;
            self.spec_budget = 0;
        }
        self.offset -= n;
        Ok(())
    }

    pub(super) fn retained(&self) -> mlx_core::Result<Option<(Array, Array)>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) if self.offset > 0 => Ok(Some((self.temporal_order(k)?, self.temporal_order(v)?))),
            _ => Ok(None),
        }
    }

    /// The same cache with buffers of its own (see [`super::Cache::detached`]).
    pub(super) fn detached(&self) -> mlx_core::Result<RotatingKvCache> {
        let own = |a: &Option<Array>| a.as_ref().map(super::own_buffer).transpose();
        Ok(RotatingKvCache { keys: own(&self.keys)?, values: own(&self.values)?, ..self.clone() })
    }

    pub(super) fn state(&self) -> Vec<&Array> {
        self.keys.iter().chain(self.values.iter()).collect()
    }
}
