//! Drawing training anchors from a shard, aligned as inference sees them.
//!
//! An anchor at position g of a sequence has the γ tokens after it as its block; its context
//! is the rows *strictly before* g (at most `max_ctx` of them, left-padded and masked), since
//! at inference the anchor's own row is produced only by the next verify; block position k is
//! scored against the target's final-norm hidden at g+k, the one that predicts x_{g+1+k}.

use mlx_core::{Array, Dtype};
use spec_decode::dspark::train::TrainBatch;

use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::shards::Shard;

/// Anchors of a sequence of length `len` whose response starts at `resp`: positions with γ
/// tokens after them, in the response (the last prompt token counts: it anchors the first
/// response block).
fn anchor_range(len: usize, resp: usize, gamma: usize) -> std::ops::Range<usize> {
    resp.saturating_sub(1)..len.saturating_sub(gamma)
}

/// Number of anchors the shard offers for a block of `gamma`.
pub fn anchors_in(shard: &Shard, gamma: usize) -> usize {
    shard.seqs.iter().map(|&(_, len, resp)| anchor_range(len, resp, gamma).len()).sum()
}

/// A batch of `a` anchors drawn uniformly over the shard's anchors.
pub fn sample_batch(shard: &Shard, a: usize, gamma: usize, max_ctx: usize, rng: &mut SplitMix64) -> Result<TrainBatch> {
    let total = anchors_in(shard, gamma);
    if total == 0 {
        return Err(Error::State {
            path: shard.path.clone(),
            detail: format!(
                "no sequence has a response with {gamma} tokens after an anchor (γ too long for this data)"
            ),
        });
    }
    let picks: Vec<usize> = (0..a).map(|_| rng.below(total as u64) as usize).collect();
    batch_at(shard, &picks, gamma, max_ctx)
}

/// The batch of the shard's anchors numbered `picks` (0..`anchors_in`, counted sequence by
/// sequence), for a deterministic pass over every anchor.
pub fn batch_at(shard: &Shard, picks: &[usize], gamma: usize, max_ctx: usize) -> Result<TrainBatch> {
    let h = shard.meta.target.hidden_size as i32;
    let width = (shard.meta.tap_layers.len() * shard.meta.target.hidden_size) as i32;
    let a = picks.len();
    let (mut ctx_idx, mut ctx_mask, mut anchors, mut block, mut tgt_idx) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for &pick in picks {
        // The pick-th anchor over all sequences, so long sequences count in proportion.
        let mut k = pick;
        let &(start, len, resp) = shard
            .seqs
            .iter()
            .find(|&&(_, len, resp)| {
                let n = anchor_range(len, resp, gamma).len();
                if k < n {
                    true
                } else {
                    k -= n;
                    false
                }
            })
            .ok_or_else(|| Error::Mismatch { what: "sampler", detail: format!("anchor {pick} is past the shard") })?;
        let t = anchor_range(len, resp, gamma).start + k; // local anchor position
        let g = start + t;
        let n_ctx = t.min(max_ctx);
        for c in 0..max_ctx {
            let real = c >= max_ctx - n_ctx;
            ctx_idx.push(if real { (g + c - max_ctx) as u32 } else { 0 });
            ctx_mask.push(real);
        }
        anchors.push(shard.ids[g]);
        block.extend_from_slice(&shard.ids[g + 1..=g + gamma]);
        tgt_idx.extend((g..g + gamma).map(|i| i as u32));
    }
    let (ai, gi, ci) = (a as i32, gamma as i32, max_ctx as i32);
    let ctx_rows = shard.rows.take(&Array::from_slice(&ctx_idx, &[ai * ci])?, 0)?.reshape(&[ai, ci, width])?;
    // The final-norm hidden is the last tap: the last H features of each row.
    let target_hidden = shard
        .rows
        .take(&Array::from_slice(&tgt_idx, &[ai * gi])?, 0)?
        .slice_axis(1, width - h, width)?
        .reshape(&[ai, gi, h])?;
    Ok(TrainBatch {
        ctx_rows,
        ctx_mask: Array::from_slice(&ctx_mask, &[ai, ci])?.astype(Dtype::Bool)?,
        anchors: Array::from_slice(&anchors, &[ai])?,
        block: Array::from_slice(&block, &[ai, gi])?,
        target_hidden,
    })
}
