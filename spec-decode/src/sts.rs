//! Sequential temperature scaling (STS) of the confidence head: for block positions k = 1..γ,
//! left to right, a temperature T_k on the confidence logit, c_k = σ(z_k / T_k), chosen by a
//! one-dimensional grid search that minimises the expected calibration error (20 bins) of the
//! cumulative survival ∏_{i≤k} c_i against "the first k drafts were all accepted", with the
//! earlier positions' temperatures held fixed. A positive temperature never reorders the
//! scores of a position, and T = 1 everywhere (before fitting) is the identity.

use crate::calibration::ConfSample;
use crate::reliability::ece;

/// Bins of the calibration error STS minimises.
pub const ECE_BINS: usize = 20;

/// One verify round as calibration sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundSample {
    /// Confidence logits of the verified drafts, block order // `[d]`
    pub logits: Vec<f32>,
    /// How many leading drafts were accepted (0..=d).
    pub accepted: usize,
}

/// Per-position temperatures (index k = block position, 0-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Sts {
    pub temperatures: Vec<f32>,
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The logit z of a confidence c = σ(z); ±∞ at 1 and 0, NaN outside [0, 1].
pub fn confidence_logit(c: f32) -> f32 {
    let c = c as f64;
    (c / (1.0 - c)).ln() as f32
}

impl Sts {
    /// The identity: T = 1 at every one of `gamma` positions.
    pub fn identity(gamma: usize) -> Sts {
        Sts { temperatures: vec![1.0; gamma] }
    }

    /// Calibrated confidence of one position (positions past the fitted ones use T = 1).
    pub fn confidence(&self, k: usize, logit: f32) -> f32 {
        let t = self.temperatures.get(k).copied().unwrap_or(1.0) as f64;
        sigmoid(logit as f64 / t) as f32
    }

    /// Cumulative survivals of a block from the drafter's raw confidences c = σ(z) (the loop
    /// reads those): each is mapped back to its logit z and rescaled.
    pub fn survivals_of_confidences(&self, conf: &[f32]) -> Vec<f32> {
        let logits: Vec<f32> = conf.iter().map(|&c| confidence_logit(c)).collect();
        self.survivals(&logits)
    }

    /// Cumulative survivals a_k = ∏_{i≤k} c_i of a block's confidence logits.
    pub fn survivals(&self, logits: &[f32]) -> Vec<f32> {
        let mut s = 1f64;
        logits
            .iter()
            .enumerate()
            .map(|(k, &z)| {
                s *= self.confidence(k, z) as f64;
                s as f32
            })
            .collect()
    }

    /// Predicted survivals and outcomes ("the first k + 1 drafts were all accepted") at block
    /// position `k` (0-based) over the rounds that verified that position.
    pub fn position_outcomes(&self, rounds: &[RoundSample], k: usize) -> (Vec<f32>, Vec<bool>) {
        rounds.iter().filter(|r| r.logits.len() > k).map(|r| (self.survivals(&r.logits)[k], r.accepted > k)).unzip()
    }

    /// Fits γ temperatures left to right; positions with fewer than `min_samples` rounds keep
    /// T = 1. The grid is log-spaced over [0.05, 20] and contains 1 (ties keep the temperature
    /// nearest 1).
    pub fn fit(samples: &[RoundSample], gamma: usize, min_samples: usize) -> Sts {
        let grid: Vec<f64> = {
            let mut g: Vec<f64> = (0..=120).map(|i| 0.05f64 * (400f64).powf(i as f64 / 120.0)).collect();
            g.push(1.0);
            g
        };
        let mut sts = Sts::identity(gamma);
        // Running survival of positions before k, per round.
        let mut prefix: Vec<f64> = vec![1.0; samples.len()];
        for k in 0..gamma {
            let rows: Vec<usize> = (0..samples.len()).filter(|&r| samples[r].logits.len() > k).collect();
            if rows.len() >= min_samples.max(1) {
                let labels: Vec<bool> = rows.iter().map(|&r| samples[r].accepted > k).collect();
                let mut best = (f64::INFINITY, 1.0f64);
                for &t in &grid {
                    let p: Vec<f32> =
                        rows.iter().map(|&r| (prefix[r] * sigmoid(samples[r].logits[k] as f64 / t)) as f32).collect();
                    let e = ece(&p, &labels, ECE_BINS);
                    let better = e < best.0 - 1e-12 || (e <= best.0 + 1e-12 && (t.ln().abs() < best.1.ln().abs()));
                    if better {
                        best = (e, t);
                    }
                }
                sts.temperatures[k] = best.1 as f32;
            }
            for &r in &rows {
                prefix[r] *= sts.confidence(k, samples[r].logits[k]) as f64;
            }
        }
        sts
    }
}

/// Rebuilds verify rounds from the decode loop's per-position samples (each round's samples
/// run from block position 0 upward, in order), as confidence logits and accepted counts.
pub fn rounds_from_samples(samples: &[ConfSample]) -> Vec<RoundSample> {
    let mut rounds: Vec<RoundSample> = Vec::new();
    for s in samples {
        if s.pos == 0 || rounds.is_empty() {
            rounds.push(RoundSample { logits: Vec::new(), accepted: 0 });
        }
        if let Some(r) = rounds.last_mut() {
            r.logits.push(confidence_logit(s.conf));
            if s.accepted && r.accepted == r.logits.len() - 1 {
                r.accepted += 1;
            }
        }
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds whose true acceptance law is σ(z / 3) per position (over-confident raw logits).
    fn rounds(n: usize, gamma: usize) -> Vec<RoundSample> {
        let mut state = 12345u64;
        let mut uniform = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 53) as f64)
        };
        (0..n)
            .map(|_| {
                let logits: Vec<f32> = (0..gamma).map(|_| (uniform() * 16.0 - 8.0) as f32).collect();
                let accepted = logits.iter().take_while(|&&z| uniform() < sigmoid(z as f64 / 3.0)).count();
                RoundSample { logits, accepted }
            })
            .collect()
    }

    #[test]
    fn rounds_are_rebuilt_from_samples() {
        let s = |pos, conf, accepted| ConfSample { pos, conf, accepted };
        let got = rounds_from_samples(&[s(0, 0.5, true), s(1, 0.5, false), s(0, 0.5, false), s(0, 0.5, true)]);
        assert_eq!(got.iter().map(|r| (r.logits.len(), r.accepted)).collect::<Vec<_>>(), [(2, 1), (1, 0), (1, 1)]);
        assert_eq!(got[0].logits[0], 0.0, "σ(0) = 0.5");
    }

    #[test]
    fn identity_before_fitting() {
        let s = Sts::identity(3);
        assert_eq!(s.confidence(1, 0.7), sigmoid(0.7) as f32);
        let v = s.survivals(&[0.0, 0.0]);
        assert_eq!(v, vec![0.5, 0.25]);
    }

    #[test]
    fn recovers_the_temperature_and_lowers_the_error() {
        let data = rounds(6000, 3);
        let fitted = Sts::fit(&data, 3, 50);
        let t0 = fitted.temperatures[0];
        assert!((2.3..=3.9).contains(&t0), "position 0 temperature {t0}, the law's is 3");
        let err = |sts: &Sts, k: usize| {
            let (p, y): (Vec<f32>, Vec<bool>) =
                data.iter().map(|r| (sts.survivals(&r.logits)[k], r.accepted > k)).unzip();
            ece(&p, &y, ECE_BINS)
        };
        for k in 0..3 {
            assert!(err(&fitted, k) < err(&Sts::identity(3), k), "position {k}: STS must lower the ECE");
            assert!(err(&fitted, k) < 0.04, "position {k}: ECE after STS {}", err(&fitted, k));
        }
    }

    #[test]
    fn never_reorders_scores_and_skips_thin_positions() {
        let data = rounds(400, 2);
        let fitted = Sts::fit(&data, 4, 50);
        assert_eq!(&fitted.temperatures[2..], &[1.0, 1.0], "positions without samples stay at 1");
        assert!(fitted.temperatures.iter().all(|&t| t > 0.0));
        for k in 0..2 {
            let mut z: Vec<f32> = data.iter().map(|r| r.logits[k]).collect();
            z.sort_by(f32::total_cmp);
            let c: Vec<f32> = z.iter().map(|&x| fitted.confidence(k, x)).collect();
            assert!(c.windows(2).all(|w| w[0] <= w[1]), "position {k}: calibrated scores keep the logits' order");
        }
    }
}
