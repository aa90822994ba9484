//! Confidence-scheduled draft length, single-request form (docs/verify.md, "Confidence
//! pruning" and "Throughput schedule"). Either the block is cut at the first position k ≥ 1
//! whose confidence is below that position's threshold (position 0 is always kept), or the
//! hardware-aware schedule admits positions while the expected throughput improves
//! ([`crate::schedule::throughput`]), which may verify no draft at all. Both only truncate, never
//! re-draw, and both decide on position k from confidences that depend on drafts before k
//! only, so the window is a stopping time and speculative sampling stays exact.

use crate::error::{Error, Result};

/// Where thresholds come from. The sources do not combine: exactly one rule is in force.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Pruning {
    /// Verify every proposed draft.
    #[default]
    Off,
    /// One threshold for every position.
    MinConf(f32),
    /// Per-position thresholds (index k = block position; entries past the end do not prune).
    Thresholds(Vec<f32>),
    /// The drafter checkpoint's own thresholds: calibrated ones for DSpark, `confidence_threshold`
    /// for DeepSpec (an error if it has none).
    Calibrated,
    /// The hardware-aware schedule (Algorithm 1): STS-calibrated survivals against the
    /// profiled verify costs.
    Throughput(ThroughputPlan),
}

/// What the throughput schedule needs: the drafter's STS fit and the target's profiled verify
/// costs on this device.
#[derive(Clone, Debug, PartialEq)]
pub struct ThroughputPlan {
    /// Per-position scaling of the confidence logit (from calibration).
    pub sts: crate::calibration::sts::Sts,
    /// Cost of a round verifying n = 1, 2, … tokens, in decode steps: v(n) = T_verify(n) /
    /// T_decode(1), plus the proposal's cost when profiled (see `profile::VerifyProfile`).
    pub cost: Vec<f32>,
    /// Propose only a little more than recent windows used ([`crate::schedule::draft_cap`]); on by
    /// default, off to measure what it saves.
    pub draft_cap: bool,
    /// Price drafts at the request's achieved rate ([`crate::schedule::throughput::rate_window`]) once it
    /// is known; off: every round maximises its own ratio (the paper's Algorithm 1 as stated).
    pub rate_rule: bool,
    /// The rate to use before the request has one of its own (the gate sets it so its
    /// single-round samples run the rate rule); `None` uses the round's own ratio until then.
    pub rate_seed: Option<f64>,
    /// Choose the window after seeing every confidence (biased; the statistical gate only).
    pub(crate) look_ahead: bool,
}

impl ThroughputPlan {
    /// A plan from a calibration and a cost table, with the draft cap and rate rule on.
    pub fn new(sts: crate::calibration::sts::Sts, cost: Vec<f32>) -> ThroughputPlan {
        ThroughputPlan { sts, cost, draft_cap: true, rate_rule: true, rate_seed: None, look_ahead: false }
    }

    /// The same plan with each round maximising its own expected throughput (the paper's
    /// Algorithm 1 as stated), for comparison.
    pub fn per_round_ratio(self) -> ThroughputPlan {
        ThroughputPlan { rate_rule: false, ..self }
    }

    /// The same plan using `rate` tokens per step before the request has measured its own.
    pub fn with_rate_seed(self, rate: f64) -> ThroughputPlan {
        ThroughputPlan { rate_seed: Some(rate), ..self }
    }

    /// The same plan proposing the whole block every round.
    pub fn without_draft_cap(self) -> ThroughputPlan {
        ThroughputPlan { draft_cap: false, ..self }
    }

    /// The same plan with a scheduler that picks the best window after seeing all confidences
    /// (not a stopping time, so NOT lossless): for the gate that shows its test catches this.
    #[cfg(feature = "testing")]
    pub fn look_ahead(self) -> ThroughputPlan {
        ThroughputPlan { look_ahead: true, draft_cap: false, ..self }
    }

    /// Whether this is the gate's biased look-ahead scheduler.
    pub fn is_look_ahead(&self) -> bool {
        self.look_ahead
    }

    /// Drafts to verify for a block with these confidences (0 = a plain decode step); `rate`
    /// is the request's tokens per step so far, if known.
    pub fn window(&self, conf: &[f32], rate: Option<f64>) -> usize {
        let survival = self.sts.survivals_of_confidences(conf);
        if self.look_ahead {
            return crate::schedule::throughput::look_ahead_window(&survival, &self.cost);
        }
        match rate.or(self.rate_seed) {
            Some(r) if self.rate_rule => crate::schedule::throughput::rate_window(&survival, &self.cost, r),
            _ => crate::schedule::throughput::throughput_window(&survival, &self.cost),
        }
    }
}

/// A pruning rule resolved against a drafter: how a round decides its verify window.
#[derive(Clone, Debug, PartialEq)]
pub enum Cut {
    /// Per-position thresholds ([`kept_len`]); empty reads confidences without pruning.
    Thresholds(Vec<f32>),
    /// Windows maximising expected accepted-plus-bonus tokens per unit of round cost.
    Throughput(ThroughputPlan),
}

impl Cut {
    /// Drafts kept of a block with confidences `conf` (`rate`: the request's tokens per step
    /// so far, which only the throughput schedule reads).
    pub fn kept(&self, conf: &[f32], rate: Option<f64>) -> usize {
        match self {
            Cut::Thresholds(t) => kept_len(conf, t),
            Cut::Throughput(p) => p.window(conf, rate),
        }
    }
}

impl Pruning {
    /// True unless `Off`.
    pub fn is_active(&self) -> bool {
        !matches!(self, Pruning::Off)
    }

    /// Resolves the rule for a block of `gamma` drafts (`Calibrated` against the drafter's
    /// thresholds); validates ranges.
    pub fn resolve(&self, calibrated: Option<Vec<f32>>, gamma: usize) -> Result<Option<Cut>> {
        if let Pruning::Throughput(plan) = self {
            let bad = |detail: String| Error::Settings { field: "schedule", detail };
            if plan.cost.len() < 2 {
                return Err(bad(format!(
                    "the verify-cost profile has {} entries; the throughput schedule needs v(1) and v(2) at least",
                    plan.cost.len()
                )));
            }
            if let Some(v) = plan.cost.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
                return Err(bad(format!("verify cost {v} in the profile: expected positive costs")));
            }
            plan.sts.check().map_err(bad)?;
            if let Some(r) = plan.rate_seed.filter(|r| !(r.is_finite() && *r > 0.0)) {
                return Err(bad(format!("rate seed {r}: expected a positive number of tokens per decode step")));
            }
            return Ok(Some(Cut::Throughput(plan.clone())));
        }
        Ok(self.thresholds(calibrated, gamma)?.map(Cut::Thresholds))
    }

    fn thresholds(&self, calibrated: Option<Vec<f32>>, gamma: usize) -> Result<Option<Vec<f32>>> {
        let check = |v: &[f32]| -> Result<()> {
            match v.iter().find(|t| !(0.0..=1.0).contains(*t)) {
                Some(t) => {
                    Err(Error::Settings { field: "pruning", detail: format!("threshold {t} is outside [0, 1]") })
                }
                None => Ok(()),
            }
        };
        Ok(match self {
            Pruning::Off => None,
            Pruning::MinConf(t) => {
                check(&[*t])?;
                Some(vec![*t; gamma])
            }
            Pruning::Thresholds(v) => {
                check(v)?;
                Some(v.clone())
            }
            Pruning::Calibrated => {
                let v = calibrated.ok_or_else(|| Error::Settings {
                    field: "pruning",
                    detail:
                        "the drafter checkpoint has no thresholds of its own (a DSpark drafter gets them from calibration, a DeepSpec one from its confidence_threshold); give a minimum confidence instead"
                            .into(),
                })?;
                check(&v)?;
                Some(v)
            }
            Pruning::Throughput(_) => None,
        })
    }
}

/// The number of drafts kept: the first k ≥ 1 with `conf[k] < thresholds[k]`, else all. A
/// threshold of 1 always cuts (a sigmoid can round to exactly 1.0 in f32, which `<` would keep).
pub fn kept_len(conf: &[f32], thresholds: &[f32]) -> usize {
    (1..conf.len()).find(|&k| thresholds.get(k).is_some_and(|&t| t >= 1.0 || conf[k] < t)).unwrap_or(conf.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_never_pruned() {
        assert_eq!(kept_len(&[0.0, 0.9], &[1.0, 0.5]), 2);
        assert_eq!(kept_len(&[0.1], &[0.9]), 1);
    }

    #[test]
    fn cuts_at_first_low_confidence() {
        assert_eq!(kept_len(&[0.9, 0.8, 0.3, 0.9], &[0.5; 4]), 2);
        assert_eq!(kept_len(&[0.9, 0.8, 0.7], &[0.5; 4]), 3);
        assert_eq!(kept_len(&[0.9, 0.8, 0.7], &[0.0, 0.0]), 3, "positions without a threshold never prune");
    }

    #[test]
    fn a_threshold_of_one_always_cuts() {
        assert_eq!(kept_len(&[1.0, 1.0, 1.0], &[1.0; 3]), 1, "saturated confidences are still cut at 1.0");
        assert_eq!(kept_len(&[1.0, 1.0, 1.0], &[0.0, 1.0, 0.0]), 1);
    }

    #[test]
    fn calibrated_needs_thresholds() {
        assert!(Pruning::Calibrated.resolve(None, 4).is_err());
        assert_eq!(
            Pruning::Calibrated.resolve(Some(vec![0.0, 0.4]), 4).unwrap(),
            Some(Cut::Thresholds(vec![0.0, 0.4]))
        );
        assert!(Pruning::MinConf(1.5).resolve(None, 4).is_err());
        assert_eq!(
            Pruning::MinConf(0.5).resolve(None, 100).unwrap(),
            Some(Cut::Thresholds(vec![0.5; 100])),
            "every position of a long block prunes"
        );
        assert_eq!(Pruning::Off.resolve(Some(vec![0.3]), 4).unwrap(), None);
    }

    #[test]
    fn throughput_plans_are_checked_and_may_verify_nothing() {
        let plan =
            |cost: Vec<f32>| Pruning::Throughput(ThroughputPlan::new(crate::calibration::sts::Sts::identity(3), cost));
        assert!(plan(vec![1.0]).resolve(None, 3).unwrap_err().to_string().contains("v(2)"));
        assert!(plan(vec![1.0, f32::NAN]).resolve(None, 3).is_err());
        let bad_t = Pruning::Throughput(ThroughputPlan::new(
            crate::calibration::sts::Sts::with_temperatures(vec![0.0]),
            vec![1.0, 1.1],
        ));
        assert!(bad_t.resolve(None, 3).unwrap_err().to_string().contains("temperature"));
        let bad_seed = Pruning::Throughput(
            ThroughputPlan::new(crate::calibration::sts::Sts::identity(3), vec![1.0, 1.1]).with_rate_seed(f64::NAN),
        );
        assert!(bad_seed.resolve(None, 3).unwrap_err().to_string().contains("rate seed"));
        let Some(cut) = plan(vec![1.0, 1.5, 1.6]).resolve(None, 3).unwrap() else { panic!("no cut") };
        // σ(z) confidences: 0.4 alone does not pay for v(2) = 1.5; 0.8 does.
        assert_eq!(cut.kept(&[0.4, 0.99], None), 0);
        assert_eq!(cut.kept(&[0.8, 0.01], None), 1);
        assert_eq!(cut.kept(&[0.8, 0.99], None), 2);
        // At a request rate of 1.5 tokens a step the first draft must beat 1.5 · 0.5.
        assert_eq!(cut.kept(&[0.7, 0.99], Some(1.5)), 0);
        assert_eq!(cut.kept(&[0.8, 0.99], Some(1.5)), 2);
    }
}
