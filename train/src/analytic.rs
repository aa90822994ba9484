//! Analytic acceptance over every anchor of some data: for each anchor, the probability that
//! draft k is accepted under speculative sampling is a_k = 1 − ½‖p^d_k − p^t_k‖₁ (given the
//! earlier drafts were), so the expected accepted length is τ = 1 + Σ_j Π_{i≤j} a_i.

use gemma4::Model;
use spec_decode::dspark::train::{dspark_loss, forward_train, LossTerms, LossWeights};
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
    let mut sum = EvalSum::new(gamma);
    let picks: Vec<usize> = (0..n).collect();
    for chunk in picks.chunks(batch.max(1)) {
        let b = batch_at(shard, chunk, gamma, max_ctx)?;
        let f = forward_train(drafter.config(), drafter.dims(), &params, target, &b)?;
        sum.add(&dspark_loss(&f, target, &b, &LossWeights::default())?, chunk.len() as f64)?;
    }
    Ok(sum.mean())
}

/// Weighted sums of τ, loss and per-position acceptance over evaluation batches.
pub(crate) struct EvalSum {
    tau: f64,
    greedy_tau: f64,
    loss: f64,
    acceptance: Vec<f64>,
    weight: f64,
}

impl EvalSum {
    pub(crate) fn new(gamma: usize) -> EvalSum {
        EvalSum { tau: 0.0, greedy_tau: 0.0, loss: 0.0, acceptance: vec![0.0; gamma], weight: 0.0 }
    }

    /// Adds one batch's terms with weight `w` (reads them back from the device).
    pub(crate) fn add(&mut self, t: &LossTerms, w: f64) -> Result<()> {
        self.tau += w * f64::from(t.tau.to_f32_vec()?[0]);
        self.greedy_tau += w * f64::from(t.greedy_tau.to_f32_vec()?[0]);
        self.loss += w * f64::from(t.total.to_f32_vec()?[0]);
        for (a, v) in self.acceptance.iter_mut().zip(t.acceptance.to_f32_vec()?) {
            *a += w * f64::from(v);
        }
        self.weight += w;
        Ok(())
    }

    /// The weighted means.
    pub(crate) fn mean(self) -> EvalReport {
        let n = self.weight.max(f64::MIN_POSITIVE);
        EvalReport {
            tau: self.tau / n,
            greedy_tau: self.greedy_tau / n,
            loss: self.loss / n,
            acceptance: self.acceptance.iter().map(|a| a / n).collect(),
        }
    }
}
