//! A stepwise forward's cache writes and row attention for all the sessions of a batched step in
//! one graph node per layer.
//!
//! Written with graph ops, each session costs every layer several nodes (slices of its new
//! rows, buffer updates, views of each row's keys), ~10 µs of host work apiece on a CPU, so a
//! 16-session step spent more on bookkeeping than on its products. Here the caller computes a
//! plan on the host (plain integers: which rows go where in each session's new buffer, which
//! ranges of it each query row reads, in order) and one node carries it out. Each row's
//! attention is [`crate::blas::row_attention`]'s arithmetic over the same keys in the same
//! order, so its bits are those of the composed form and of a one-token decode step.

use std::ops::Range;

use crate::array::List;
use crate::{Array, Error, Result};

/// Where a run of rows of a session's new cache buffer comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowSource {
    /// The session's buffer before this write.
    Old,
    /// The session's rows of this forward's new keys and values.
    New,
}

/// `count` rows from `src` starting at row `start` written at row `dst` of the new buffer.
/// Copies apply in order (a later one overwrites an earlier one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowCopy {
    /// The first row written in the new buffer.
    pub dst: usize,
    /// Where the rows come from.
    pub src: RowSource,
    /// The first row read from `src`.
    pub start: usize,
    /// Rows copied.
    pub count: usize,
}

/// One session's part of a write: its buffers (consumed: buffers nothing else holds are
/// rewritten in place where the copies allow it, instead of copied), how many of the forward's rows are its own,
/// the new buffers' length and how they are built.
#[derive(Debug)]
pub struct CacheWrite {
    /// `[1, Hkv, L, D]` f32
    pub keys: Array,
    /// `[1, Hkv, L, D]` f32
    pub values: Array,
    /// The forward's rows that are this session's (its new rows and query rows).
    pub rows: usize,
    /// The new buffers' length in rows.
    pub len: usize,
    /// How the new buffers are built, in order.
    pub copies: Vec<RowCopy>,
}

fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Host { op: "row_cache_attention", detail: format!("{what} {v} overflows i32") })
}

fn push_reads(plan: &mut Vec<i32>, reads: &[Vec<Range<usize>>]) -> Result<()> {
    for row in reads {
        plan.push(int(row.len(), "ranges")?);
        for r in row {
            plan.extend([int(r.start, "range start")?, int(r.end, "range end")?]);
        }
    }
    Ok(())
}

fn run(inputs: Vec<&Array>, plan: &[i32], writes: bool, scale: f32) -> Result<Vec<Array>> {
    let l = List::new(inputs)?;
    let out = crate::sys::ffi::row_cache_attention(l.raw(), plan, writes, scale)
        .map_err(|e| crate::error::mlx_err("row_cache_attention", e))?;
    List(out).into_vec("row_cache_attention")
}

/// Writes the sessions' new rows into their caches and attends every query row over its
/// ranges of its session's new buffer. `q` `[1, Hq, R, D]` (roped), `k`, `v` `[1, Hkv, R, D]`
/// (the sessions' rows in turn, `writes[s].rows` each), `reads[i]` row i's key ranges in order.
/// Returns (`[1, Hq, R, D]`, each session's new (keys, values) `[1, Hkv, len, D]`). f32, CPU.
#[track_caller]
pub fn attend_and_write(
    q: &Array,
    k: &Array,
    v: &Array,
    writes: Vec<CacheWrite>,
    reads: &[Vec<Range<usize>>],
    scale: f32,
) -> Result<(Array, Vec<(Array, Array)>)> {
    let mut plan = vec![int(writes.len(), "sessions")?];
    for w in &writes {
        // Rewritten in place only if nothing but this write holds the buffers (see the kernel).
        let alone = crate::sys::ffi::sole_holder(w.keys.raw()) && crate::sys::ffi::sole_holder(w.values.raw());
        plan.extend([
            int(w.rows, "rows")?,
            int(w.len, "buffer length")?,
            i32::from(alone),
            int(w.copies.len(), "copies")?,
        ]);
        for c in &w.copies {
            let src = match c.src {
                RowSource::Old => 0,
                RowSource::New => 1,
            };
            plan.extend([
                int(c.dst, "copy destination")?,
                src,
                int(c.start, "copy start")?,
                int(c.count, "copy count")?,
            ]);
        }
    }
    push_reads(&mut plan, reads)?;
    let n = writes.len();
    let out = {
        let inputs = [q, k, v].into_iter().chain(writes.iter().flat_map(|w| [&w.keys, &w.values])).collect();
        run(inputs, &plan, true, scale)?
    };
    // The old buffers go before the node runs, so a buffer nothing else holds is donated.
    drop(writes);
    let mut out = out.into_iter();
    let o = out.next().ok_or_else(|| Error::Host { op: "row_cache_attention", detail: "no output".into() })?;
    let mut buffers = Vec::with_capacity(n);
    while let (Some(kb), Some(vb)) = (out.next(), out.next()) {
        buffers.push((kb, vb));
    }
    if buffers.len() != n {
        return Err(Error::Host {
            op: "row_cache_attention",
            detail: format!("{} buffer pairs for {n} sessions", buffers.len()),
        });
    }
    Ok((o, buffers))
}

/// Attends every query row over its ranges of its session's buffers, written by nobody (a
/// KV-shared layer reading its donor's caches). `buffers[s]` (keys, values) `[1, Hkv, L_s, D]`,
/// `rows[s]` the session's query rows, `reads[i]` row i's ranges. Returns `[1, Hq, R, D]`.
#[track_caller]
pub fn attend_ranges(
    q: &Array,
    buffers: &[(Array, Array)],
    rows: &[usize],
    reads: &[Vec<Range<usize>>],
    scale: f32,
) -> Result<Array> {
    if rows.len() != buffers.len() {
        return Err(Error::Host {
            op: "row_cache_attention",
            detail: format!("{} sessions' rows for {} buffer pairs", rows.len(), buffers.len()),
        });
    }
    let mut plan = vec![int(buffers.len(), "sessions")?];
    for ((k, _), &r) in buffers.iter().zip(rows) {
        plan.extend([int(r, "rows")?, k.dim(2)?, 0, 0]);
    }
    push_reads(&mut plan, reads)?;
    let inputs = std::iter::once(q).chain(buffers.iter().flat_map(|(k, v)| [k, v])).collect();
    run(inputs, &plan, false, scale)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Host { op: "row_cache_attention", detail: "no output".into() })
}
