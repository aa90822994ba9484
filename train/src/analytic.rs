//! Analytic acceptance over every anchor of some data: for each anchor, the probability that
//! draft k is accepted under speculative sampling is a_k = 1 − ½‖p^d_k − p^t_k‖₁ (given the
//! earlier drafts were), so the expected accepted length is τ = 1 + Σ_j Π_{i≤j} a_i.

use gemma4::Model;
use spec_decode::dspark::train::{dspark_loss, forward_train, LossWeights};
use spec_decode::dspark::DSparkDrafter;

use crate::drafter_train::EvalReport;
use crate::error::{Error, Result};
use crate::sampler::{anchors_in, batch_at};
use crate::shards::Shard;

/// τ and per-position acceptance averaged over every anchor of `shard`, `batch` at a time.
pub fn analytic_all(
    target: &Model,
    drafter: &DSparkDrafter,
    shard: &Shard,
    max_ctx: usize,
    batch: usize,
) -> Result<EvalReport> {
    let gamma = drafter.config().gamma;
    let n = anchors_in(shard, gamma);
    if n == 0 {
        return Err(Error::Mismatch { what: "analytic τ", detail: format!("no anchor has {gamma} tokens after it") });
    }
    let params = drafter.trainable_params()?;
    let (mut tau, mut loss, mut acc) = (0.0, 0.0, vec![0.0; gamma]);
    let picks: Vec<usize> = (0..n).collect();
    for chunk in picks.chunks(batch.max(1)) {
        let b = batch_at(shard, chunk, gamma, max_ctx)?;
        let f = forward_train(drafter.config(), drafter.dims(), &params, target, &b)?;
        let t = dspark_loss(&f, target, &b, &LossWeights::default())?;
        let w = chunk.len() as f64;
        tau += w * f64::from(t.tau.to_f32_vec()?[0]);
        loss += w * f64::from(t.total.to_f32_vec()?[0]);
        for (a, v) in acc.iter_mut().zip(t.acceptance.to_f32_vec()?) {
            *a += w * f64::from(v);
        }
    }
    let n = n as f64;
    Ok(EvalReport { tau: tau / n, loss: loss / n, acceptance: acc.iter().map(|a| a / n).collect() })
}
