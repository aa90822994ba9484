//! Confidence-threshold calibration for pruning: from greedy runs, per block position k ≥ 1,
//! the smallest threshold τ whose smoothed precision — P(draft k accepted | c_k ≥ τ), with
//! Laplace (+1/+2) smoothing — reaches the target. Positions with too few samples get 0 (never
//! prune); positions where no threshold reaches the target get 1.0 (always prune there);
//! position 0 is never pruned. Deterministic and independent of sample order.
//!
//! The result is stored with the STS fits: `config.sts` in `dspark.json`, or the sidecar
//! [`super::SIDECAR_FILE`] for DeepSpec checkpoints. See docs/verify.md, "Confidence pruning".

/// One observed draft position.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConfSample {
    /// Block position.
    pub pos: usize,
    /// The drafter's confidence at that position.
    pub conf: f32,
    /// Whether the draft at that position was accepted (it and all before it).
    pub accepted: bool,
}

/// Fits per-position thresholds for a block of `gamma`.
pub fn fit_thresholds(samples: &[ConfSample], gamma: usize, target: f32, min_samples: usize) -> Vec<f32> {
    let mut out = vec![0.0; gamma];
    for (k, slot) in out.iter_mut().enumerate().skip(1) {
        let mut at: Vec<(f32, bool)> =
            samples.iter().filter(|s| s.pos == k && s.conf.is_finite()).map(|s| (s.conf, s.accepted)).collect();
        if at.len() < min_samples {
            continue;
        }
        at.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Suffix counts: samples and acceptances with conf ≥ at[i].0.
        let n = at.len();
        let mut acc_suffix = vec![0usize; n + 1];
        for i in (0..n).rev() {
            acc_suffix[i] = acc_suffix[i + 1] + at[i].1 as usize;
        }
        *slot = 1.0;
        let mut i = 0;
        while i < n {
            let tau = at[i].0;
            let precision = (acc_suffix[i] as f32 + 1.0) / ((n - i) as f32 + 2.0);
            if precision >= target {
                *slot = tau;
                break;
            }
            // Skip ties: the threshold is a value, not a position.
            while i < n && at[i].0 == tau {
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<ConfSample> {
        // Deterministic pseudo-uniform confidences; accepted iff conf > 0.6.
        let mut v = Vec::new();
        for pos in 0..5 {
            let n = if pos == 3 { 10 } else { 200 };
            for i in 0..n {
                let conf = ((i * 7919 + pos * 104729) % 1000) as f32 / 1000.0;
                v.push(ConfSample { pos, conf, accepted: pos != 4 && conf > 0.6 });
            }
        }
        v
    }

    #[test]
    fn fits_the_synthetic_pattern() {
        let t = fit_thresholds(&samples(), 5, 0.9, 50);
        assert_eq!(t[0], 0.0, "position 0 is never pruned");
        for k in [1, 2] {
            assert!(t[k] > 0.5 && t[k] < 0.65, "pos {k}: {}", t[k]);
        }
        assert_eq!(t[3], 0.0, "too few samples: never prune");
        assert_eq!(t[4], 1.0, "never accepted: always prune");
    }

    #[test]
    fn order_and_non_finite_values_do_not_matter() {
        let mut s = samples();
        let a = fit_thresholds(&s, 5, 0.8, 50);
        s.reverse();
        s.push(ConfSample { pos: 1, conf: f32::NAN, accepted: true });
        s.push(ConfSample { pos: 9, conf: 0.99, accepted: true });
        assert_eq!(fit_thresholds(&s, 5, 0.8, 50), a);
    }
}
