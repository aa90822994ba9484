//! Sequential temperature scaling (STS) of the confidence head: for block positions k = 1..γ,
//! left to right, a temperature T_k and shift b_k on the confidence logit,
//! c_k = σ(z_k / T_k + b_k), chosen by a grid search over the cumulative survival
//! ∏_{i≤k} c_i against "the first k drafts were all accepted", with the earlier positions held
//! fixed. A positive temperature never reorders the scores of a position, and T = 1, b = 0
//! everywhere (before fitting) is the identity.
//!
//! Two departures from the paper (temperature only, chosen by the expected calibration error):
//! - The shift b_k. A temperature can only pull confidences towards or away from 1/2; when the
//!   logits are centred for another event (a head trained on the sampling acceptance, read
//!   under greedy decoding), no temperature brings the mean survival to the observed rate.
//! - The objective is the log loss of the survival, not its ECE. With a shift, ECE is
//!   minimised by a constant (a large T and b at the base rate: every round in one bin), which
//!   throws away the ranking: on the default pair ECE-fitted temperatures of 6–16 cut the
//!   greedy head's held-out AUROC from 0.79 to 0.75 and left the held-out ECE at 9–14%. The log
//!   loss is a proper score: it rewards calibration and sharpness together (Platt scaling per
//!   position). ECE stays the reported measure.
//!
//! After the scaling, each position's survival goes through an isotonic map
//! ([`SurvivalMap`]) fitted on the same rounds, and the result is kept non-increasing along the
//! block. The scaling alone left the greedy head's held-out ECE at 3–5% on the default pair
//! (its reliability curve is not a sigmoid); with the maps, fitted and measured on 1500
//! prompts each, it is 1–2%. Both steps are
//! non-decreasing in each logit, so the survival of position k still depends on the drafts up
//! to k only and never reverses the order of two confidences.

use crate::calibration::reliability::log_loss;
use crate::calibration::survival_map::SurvivalMap;
use crate::calibration::ConfSample;

/// Bins of the expected calibration error calibration reports.
pub const ECE_BINS: usize = 20;

/// One verify round as calibration sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundSample {
    /// Confidence logits of the verified drafts, block order // `[d]`
    pub logits: Vec<f32>,
    /// How many leading drafts were accepted (0..=d).
    pub accepted: usize,
}

/// Per-position temperatures and shifts (index k = block position, 0-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Sts {
    /// Divides each position's confidence logit; positions past its end use 1.
    pub temperatures: Vec<f32>,
    /// Added to the scaled logit; positions past its end (or an empty list) use 0.
    pub shifts: Vec<f32>,
    /// Isotonic map of the scaled survival per position; positions past its end use none.
    pub maps: Vec<SurvivalMap>,
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
        Sts { temperatures: vec![1.0; gamma], shifts: vec![0.0; gamma], maps: Vec::new() }
    }

    /// Temperatures only (the paper's STS; b = 0).
    pub fn with_temperatures(temperatures: Vec<f32>) -> Sts {
        Sts { temperatures, shifts: Vec::new(), maps: Vec::new() }
    }

    /// The temperatures and shifts without the isotonic maps (calibration reports both stages).
    pub fn scaling_only(&self) -> Sts {
        Sts { maps: Vec::new(), ..self.clone() }
    }

    /// Calibrated confidence of one position (positions past the fitted ones use T = 1, b = 0).
    pub fn confidence(&self, k: usize, logit: f32) -> f32 {
        let t = self.temperatures.get(k).copied().unwrap_or(1.0) as f64;
        let b = self.shifts.get(k).copied().unwrap_or(0.0) as f64;
        sigmoid(logit as f64 / t + b) as f32
    }

    /// Checks that every temperature is positive and finite and every shift finite; the
    /// message names the offending value.
    pub fn check(&self) -> Result<(), String> {
        if let Some(t) = self.temperatures.iter().find(|t| !(t.is_finite() && **t > 0.0)) {
            return Err(format!("STS temperature {t}: expected positive temperatures"));
        }
        if let Some(b) = self.shifts.iter().find(|b| !b.is_finite()) {
            return Err(format!("STS shift {b}: expected finite shifts"));
        }
        for (k, m) in self.maps.iter().enumerate() {
            m.check().map_err(|e| format!("survival map of position {}: {e}", k + 1))?;
        }
        Ok(())
    }

    /// Cumulative survivals of a block from the drafter's raw confidences c = σ(z) (the loop
    /// reads those): each is mapped back to its logit z and rescaled.
    pub fn survivals_of_confidences(&self, conf: &[f32]) -> Vec<f32> {
        let logits: Vec<f32> = conf.iter().map(|&c| confidence_logit(c)).collect();
        self.survivals(&logits)
    }

    /// Cumulative survivals of a block's confidence logits: a_k = ∏_{i≤k} c_i through position
    /// k's map, never above a_{k−1}.
    pub fn survivals(&self, logits: &[f32]) -> Vec<f32> {
        let (mut s, mut prev) = (1f64, 1f32);
        logits
            .iter()
            .enumerate()
            .map(|(k, &z)| {
                s *= self.confidence(k, z) as f64;
                let a = self.maps.get(k).map_or(s as f32, |m| m.apply(s as f32));
                // NaN (a NaN logit) stays NaN rather than turning into the previous survival.
                prev = if a > prev { prev } else { a };
                prev
            })
            .collect()
    }

    /// Predicted survivals and outcomes ("the first k + 1 drafts were all accepted") at block
    /// position `k` (0-based) over the rounds that verified that position.
    pub fn position_outcomes(&self, rounds: &[RoundSample], k: usize) -> (Vec<f32>, Vec<bool>) {
        rounds.iter().filter(|r| r.logits.len() > k).map(|r| (self.survivals(&r.logits)[k], r.accepted > k)).unzip()
    }

    /// Fits the scaling ([`Sts::fit_scaling`]), then each position's isotonic map on the scaled
    /// survivals of the same rounds. A position with fewer than `min_map_rounds` rounds gets no
    /// map: a step function learns the noise of a few prompts (on the default pair, maps fitted
    /// on 175 prompts, about 6,500 rounds, did no better than the scaling alone).
    pub fn fit(samples: &[RoundSample], gamma: usize, min_samples: usize, min_map_rounds: usize) -> Sts {
        let mut sts = Sts::fit_scaling(samples, gamma, min_samples);
        let maps: Vec<SurvivalMap> = (0..gamma)
            .map(|k| {
                let (p, y) = sts.position_outcomes(samples, k);
                if p.len() >= min_samples.max(min_map_rounds).max(1) {
                    SurvivalMap::fit(&p, &y)
                } else {
                    SurvivalMap::default()
                }
            })
            .collect();
        // No position mapped: no maps at all, as before fitting.
        if maps.iter().any(|m| !m.knots.is_empty()) {
            sts.maps = maps;
        }
        sts
    }

    /// Fits γ temperatures and shifts left to right, each pair minimising the log loss of the
    /// survival; positions with fewer than `min_samples` rounds keep T = 1, b = 0. The
    /// temperature grid is log-spaced over [0.05, 20] and contains 1; shifts run over [−4, 4]
    /// in steps of 0.05. Ties keep the temperature nearest 1, then the smallest shift.
    pub fn fit_scaling(samples: &[RoundSample], gamma: usize, min_samples: usize) -> Sts {
        let grid: Vec<f64> = {
            let mut g: Vec<f64> = (0..=120).map(|i| 0.05f64 * (400f64).powf(i as f64 / 120.0)).collect();
            g.push(1.0);
            g
        };
        // By |b| first, so a tie keeps the smaller shift.
        let mut shifts: Vec<f64> = (-80..=80).map(|i| i as f64 * 0.05).collect();
        shifts.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
        let mut sts = Sts::identity(gamma);
        // Running survival of positions before k, per round.
        let mut prefix: Vec<f64> = vec![1.0; samples.len()];
        for k in 0..gamma {
            let rows: Vec<usize> = (0..samples.len()).filter(|&r| samples[r].logits.len() > k).collect();
            if rows.len() >= min_samples.max(1) {
                let labels: Vec<bool> = rows.iter().map(|&r| samples[r].accepted > k).collect();
                let mut best = (f64::INFINITY, 1.0f64, 0.0f64);
                let mut p = vec![0f32; rows.len()];
                for &t in &grid {
                    for &b in &shifts {
                        for (slot, &r) in p.iter_mut().zip(&rows) {
                            *slot = (prefix[r] * sigmoid(samples[r].logits[k] as f64 / t + b)) as f32;
                        }
                        let e = log_loss(&p, &labels);
                        let nearer = (t.ln().abs(), b.abs()) < (best.1.ln().abs(), best.2.abs());
                        if e < best.0 - 1e-12 || (e <= best.0 + 1e-12 && nearer) {
                            best = (e, t, b);
                        }
                    }
                }
                sts.temperatures[k] = best.1 as f32;
                sts.shifts[k] = best.2 as f32;
            }
            for &r in &rows {
                prefix[r] *= sts.confidence(k, samples[r].logits[k]) as f64;
            }
        }
        sts
    }
}

impl RoundSample {
    /// The decode loop's per-position samples of this round (the inverse of
    /// [`rounds_from_samples`]): raw confidence σ(z) and whether it and all before it were accepted.
    pub fn conf_samples(&self) -> impl Iterator<Item = ConfSample> + '_ {
        self.logits.iter().enumerate().map(|(pos, &z)| ConfSample {
            pos,
            conf: sigmoid(z as f64) as f32,
            accepted: pos < self.accepted,
        })
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
    use crate::calibration::reliability::ece;

    /// A seeded stream of uniform draws in [0, 1) (a 64-bit LCG's top 53 bits).
    fn uniform_stream(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 53) as f64)
        }
    }

    /// Rounds whose true acceptance law is σ(z / 3) per position (over-confident raw logits).
    fn rounds(n: usize, gamma: usize) -> Vec<RoundSample> {
        let mut uniform = uniform_stream(12345u64);
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
        let back: Vec<(usize, bool)> = got[0].conf_samples().map(|c| (c.pos, c.accepted)).collect();
        assert_eq!(back, [(0, true), (1, false)]);
        assert!(got[0].conf_samples().all(|c| c.conf == 0.5));
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
        let fitted = Sts::fit(&data, 3, 50, 1);
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
    fn a_shift_centres_logits_made_for_another_event() {
        // Acceptance follows σ(z / 2 − 1.5): the raw logits are too confident and off-centre.
        let mut uniform = uniform_stream(777u64);
        let data: Vec<RoundSample> = (0..6000)
            .map(|_| {
                let z = (uniform() * 12.0 - 6.0) as f32;
                RoundSample { logits: vec![z], accepted: usize::from(uniform() < sigmoid(z as f64 / 2.0 - 1.5)) }
            })
            .collect();
        let fitted = Sts::fit(&data, 1, 50, 1);
        assert!((fitted.shifts[0] + 1.5).abs() < 0.5, "shift {} (the law's is −1.5)", fitted.shifts[0]);
        let (p, y): (Vec<f32>, Vec<bool>) =
            data.iter().map(|r| (fitted.survivals(&r.logits)[0], r.accepted > 0)).unzip();
        // 6000 draws leave the true law itself an ECE of about 2% (sampling noise in 20 bins).
        let truth: Vec<f32> = data.iter().map(|r| sigmoid(r.logits[0] as f64 / 2.0 - 1.5) as f32).collect();
        let (after, floor) = (ece(&p, &y, ECE_BINS), ece(&truth, &y, ECE_BINS));
        assert!(after < floor + 0.01, "ECE after {after}, the true law's {floor}");
        // Temperatures alone cannot centre it.
        let temps_only = Sts::with_temperatures(fitted.temperatures.clone());
        let (p, _): (Vec<f32>, Vec<bool>) = data.iter().map(|r| (temps_only.survivals(&r.logits)[0], true)).unzip();
        assert!(ece(&p, &y, ECE_BINS) > 0.05);
        assert!(Sts { temperatures: vec![1.0], shifts: vec![f32::NAN], maps: Vec::new() }.check().is_err());
        assert!(Sts::with_temperatures(vec![0.0]).check().is_err());
    }

    #[test]
    fn never_reorders_scores_and_skips_thin_positions() {
        let data = rounds(400, 2);
        let fitted = Sts::fit(&data, 4, 50, 1);
        assert_eq!(&fitted.temperatures[2..], &[1.0, 1.0], "positions without samples stay at 1");
        assert_eq!(&fitted.shifts[2..], &[0.0, 0.0], "and unshifted");
        assert!(fitted.temperatures.iter().all(|&t| t > 0.0));
        for k in 0..2 {
            let mut z: Vec<f32> = data.iter().map(|r| r.logits[k]).collect();
            z.sort_by(f32::total_cmp);
            let c: Vec<f32> = z.iter().map(|&x| fitted.confidence(k, x)).collect();
            assert!(c.windows(2).all(|w| w[0] <= w[1]), "position {k}: calibrated scores keep the logits' order");
        }
        assert!(fitted.maps[2..].iter().all(|m| m.knots.is_empty()), "and get no map");
        // Survivals, maps included: non-decreasing in each logit, non-increasing along the block.
        let grid: Vec<f32> = (-40..=40).map(|i| i as f32 * 0.25).collect();
        for &z0 in &grid {
            let a: Vec<Vec<f32>> = grid.iter().map(|&z1| fitted.survivals(&[z0, z1, 0.0])).collect();
            assert!(a.windows(2).all(|w| w[0][1] <= w[1][1] && w[0][2] <= w[1][2]), "z0 = {z0}");
            assert!(a.iter().all(|v| v[0] >= v[1] && v[1] >= v[2]), "z0 = {z0}: {a:?}");
        }
        let b: Vec<f32> = grid.iter().map(|&z0| fitted.survivals(&[z0, 1.0])[1]).collect();
        assert!(b.windows(2).all(|w| w[0] <= w[1]), "position 1 survival must not fall as z0 rises");
    }

    #[test]
    fn the_maps_follow_a_curve_no_sigmoid_fits() {
        // Acceptance is 0.3 below z = 0 and 0.9 above it: a step, which a temperature and a
        // shift can only smear. Fitted on one set, measured on another drawn the same way.
        let draw = |seed: u64| {
            let mut uniform = uniform_stream(seed);
            (0..8000)
                .map(|_| {
                    let z = (uniform() * 8.0 - 4.0) as f32;
                    let rate = if z < 0.0 { 0.3 } else { 0.9 };
                    RoundSample { logits: vec![z], accepted: usize::from(uniform() < rate) }
                })
                .collect::<Vec<_>>()
        };
        let (train, test) = (draw(1), draw(2));
        let fitted = Sts::fit(&train, 1, 50, 1000);
        let err = |sts: &Sts| {
            let (p, y): (Vec<f32>, Vec<bool>) = sts.position_outcomes(&test, 0);
            ece(&p, &y, ECE_BINS)
        };
        let (scaled, mapped) = (err(&fitted.scaling_only()), err(&fitted));
        assert!(scaled > 0.05, "a sigmoid cannot follow a step: ECE {scaled}");
        assert!(mapped < 0.025, "held-out ECE with the map {mapped} (scaling only {scaled})");
        // Too few rounds for a map: the scaling alone.
        let thin = Sts::fit(&train, 1, 50, train.len() + 1);
        assert_eq!(thin, Sts::fit_scaling(&train, 1, 50));
    }
}
