//! Confidence-scheduled draft length, single-request form (docs/verify.md, "Confidence
//! pruning"): the block is cut at the first position k ≥ 1 whose confidence is below that
//! position's threshold. Position 0 is always kept, so a round verifies at least one draft.
//! Pruning only truncates; it never re-draws, so the kept drafts are exactly those the unpruned
//! drafter would propose.

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
}

impl Pruning {
    /// True unless `Off`.
    pub fn is_active(&self) -> bool {
        !matches!(self, Pruning::Off)
    }

    /// Resolves the rule to per-position thresholds for a block of `gamma` drafts (`Calibrated`
    /// against the drafter's thresholds); validates ranges.
    pub fn resolve(&self, calibrated: Option<Vec<f32>>, gamma: usize) -> Result<Option<Vec<f32>>> {
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
        assert_eq!(Pruning::Calibrated.resolve(Some(vec![0.0, 0.4]), 4).unwrap(), Some(vec![0.0, 0.4]));
        assert!(Pruning::MinConf(1.5).resolve(None, 4).is_err());
        assert_eq!(
            Pruning::MinConf(0.5).resolve(None, 100).unwrap(),
            Some(vec![0.5; 100]),
            "every position of a long block prunes"
        );
        assert_eq!(Pruning::Off.resolve(Some(vec![0.3]), 4).unwrap(), None);
    }
}
