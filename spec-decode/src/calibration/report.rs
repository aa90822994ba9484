//! The held-out report of a calibration: per block position, how well the survival predicts
//! "the first k drafts were all accepted" (ECE, AUROC, Brier score).

use super::reliability::{auroc, brier, ece};
use super::sts::{RoundSample, Sts, ECE_BINS};

/// Reliability of the survival at one block position.
#[derive(Clone, Debug, PartialEq)]
pub struct PositionReport {
    /// Rounds that verified the position.
    pub rounds: usize,
    /// Expected calibration error of the survival, over `ECE_BINS` equal-width bins.
    pub ece: f64,
    /// None without both outcomes among the rounds.
    pub auroc: Option<f64>,
    /// Brier score: mean squared error of the survival against the accepted/rejected outcome.
    pub brier: f64,
}

/// Per-position reliability of `sts` on `rounds` (positions 0..gamma).
pub fn report(sts: &Sts, rounds: &[RoundSample], gamma: usize) -> Vec<PositionReport> {
    (0..gamma)
        .map(|k| {
            let (p, y) = sts.position_outcomes(rounds, k);
            PositionReport { rounds: p.len(), ece: ece(&p, &y, ECE_BINS), auroc: auroc(&p, &y), brier: brier(&p, &y) }
        })
        .collect()
}
