//! Isotonic map of one block position's scaled survival onto the observed rate of "the first k
//! drafts were all accepted". Temperature and shift bend the logit only along a sigmoid; the
//! greedy head's reliability curve is not one (on the default pair blocks predicted at 0.85 at
//! positions 5–6 survive almost always, middle bins wiggle), which left held-out ECE at 3–5%
//! after scaling. Pool-adjacent-violators gives the best non-decreasing step function by squared
//! error; its blocks' centroids, joined by straight lines, are the map. Non-decreasing, so it
//! never reverses the order of two survivals (it may tie them).

/// Knots (scaled survival, calibrated survival), both non-decreasing; empty is the identity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SurvivalMap {
    /// `[scaled, calibrated]` pairs joined by straight lines; values outside the knots clamp to the end ones.
    pub knots: Vec<[f32; 2]>,
}

impl SurvivalMap {
    /// Fits the map to predictions `x` and outcomes `y` (non-finite predictions are left out);
    /// no samples give the identity.
    pub fn fit(x: &[f32], y: &[bool]) -> SurvivalMap {
        let mut pairs: Vec<(f64, f64)> =
            x.iter().zip(y).filter(|(x, _)| x.is_finite()).map(|(&x, &y)| (x as f64, y as u8 as f64)).collect();
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        // Equal predictions form one point first, so a tie is never split between knots (which
        // would make the map depend on the samples' order).
        let mut points: Vec<(f64, f64, f64)> = Vec::new();
        for (x, y) in pairs {
            match points.last_mut() {
                Some(last) if last.0 / last.2 == x => *last = (last.0 + x, last.1 + y, last.2 + 1.0),
                _ => points.push((x, y, 1.0)),
            }
        }
        // Blocks as (Σx, Σy, n); a new point merges backwards while it would break the order.
        let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
        for point in points {
            blocks.push(point);
            while blocks.len() > 1 {
                let (b, a) = (blocks[blocks.len() - 1], blocks[blocks.len() - 2]);
                if a.1 / a.2 < b.1 / b.2 {
                    break;
                }
                blocks.pop();
                if let Some(last) = blocks.last_mut() {
                    *last = (a.0 + b.0, a.1 + b.1, a.2 + b.2);
                }
            }
        }
        let knots = blocks.iter().map(|&(sx, sy, n)| [(sx / n) as f32, (sy / n) as f32]).collect();
        SurvivalMap { knots }
    }

    /// The calibrated survival of a scaled one: linear between knots, flat beyond the ends. A
    /// survival of 0 stays 0, so a draft the head rules out is never admitted.
    pub fn apply(&self, s: f32) -> f32 {
        let (Some(first), Some(last)) = (self.knots.first(), self.knots.last()) else { return s };
        if s.is_nan() {
            return s;
        }
        if s <= 0.0 {
            return 0.0;
        }
        if s <= first[0] {
            return first[1];
        }
        if s >= last[0] {
            return last[1];
        }
        // First knot strictly right of s (inside the knots' span); clamped so knots that fail
        // `check` cannot index out of range.
        let i = self.knots.partition_point(|k| k[0] <= s).clamp(1, self.knots.len() - 1);
        let ([x0, y0], [x1, y1]) = (self.knots[i - 1], self.knots[i]);
        // Knots out of order or NaN (refused by `check`) give the right knot's value.
        if x1.partial_cmp(&x0) != Some(std::cmp::Ordering::Greater) {
            return y1;
        }
        y0 + (y1 - y0) * ((s - x0) / (x1 - x0))
    }

    /// Checks the knots: finite, inside [0, 1], both coordinates non-decreasing; the message
    /// says which knot is wrong.
    pub fn check(&self) -> Result<(), String> {
        for (i, k) in self.knots.iter().enumerate() {
            if !k.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)) {
                return Err(format!("knot {i} is {k:?}: expected two numbers in [0, 1]"));
            }
            if let Some(p) = i.checked_sub(1).map(|j| self.knots[j]) {
                if k[0] < p[0] || k[1] < p[1] {
                    return Err(format!("knot {i} {k:?} is below knot {} {p:?}: expected non-decreasing knots", i - 1));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_the_identity() {
        let m = SurvivalMap::fit(&[], &[]);
        assert!(m.knots.is_empty());
        assert_eq!(m.apply(0.3), 0.3);
    }

    #[test]
    fn pools_adjacent_violators_by_hand() {
        // Outcomes 1, 0, 1, 1 at 0.1…0.4: the first two violate the order and pool to 0.5 at
        // x = 0.15; the last two are already ordered but tie at 1 and pool too.
        let m = SurvivalMap::fit(&[0.4, 0.1, 0.2, 0.3], &[true, true, false, true]);
        let want = [[0.15, 0.5], [0.35, 1.0]];
        assert_eq!(m.knots.len(), 2);
        for (k, w) in m.knots.iter().zip(want) {
            assert!((k[0] - w[0]).abs() < 1e-6 && (k[1] - w[1]).abs() < 1e-6, "{:?}", m.knots);
        }
        assert_eq!(m.apply(0.05), 0.5);
        assert!((m.apply(0.25) - 0.75).abs() < 1e-6);
        assert_eq!(m.apply(0.9), 1.0);
        assert!(m.check().is_ok());
    }

    #[test]
    fn never_reverses_order_and_lands_on_the_rate() {
        // Outcome rate 0.5 + 0.5·x² against prediction x: convex, not a sigmoid of the logit.
        let n = 4000;
        let x: Vec<f32> = (0..n).map(|i| (i as f32 + 0.5) / n as f32).collect();
        let y: Vec<bool> =
            x.iter().enumerate().map(|(i, &x)| ((i * 7919) % 1000) as f32 / 1000.0 < 0.5 + 0.5 * x * x).collect();
        let m = SurvivalMap::fit(&x, &y);
        assert!(m.check().is_ok());
        let out: Vec<f32> = x.iter().map(|&s| m.apply(s)).collect();
        assert!(out.windows(2).all(|w| w[0] <= w[1]));
        for probe in [0.2f32, 0.5, 0.8] {
            let got = m.apply(probe);
            assert!((got - (0.5 + 0.5 * probe * probe)).abs() < 0.06, "{probe}: {got}");
        }
        let before = crate::calibration::reliability::ece(&x, &y, 20);
        let after = crate::calibration::reliability::ece(&out, &y, 20);
        assert!(after < 0.02 && before > 0.15, "ECE {before} → {after}");
    }

    #[test]
    fn ties_are_one_point_whatever_their_order() {
        // Four rounds at 0.9, half accepted: one knot at the tie's rate, in either order.
        let x = [0.2, 0.9, 0.9, 0.9, 0.9];
        for y in [[false, false, true, false, true], [false, true, true, false, false]] {
            let m = SurvivalMap::fit(&x, &y);
            assert_eq!(m.knots, vec![[0.2, 0.0], [0.9, 0.5]], "{y:?}");
            assert_eq!(m.apply(0.9), 0.5);
        }
    }

    #[test]
    fn a_zero_survival_stays_zero_and_bad_knots_do_not_panic() {
        let m = SurvivalMap { knots: vec![[0.3, 0.2], [0.6, 0.7]] };
        assert_eq!((m.apply(0.0), m.apply(0.1)), (0.0, 0.2));
        assert!(m.apply(f32::NAN).is_nan());
        // Knots `check` refuses still give a number, never an index out of range.
        for knots in [vec![[f32::NAN, 0.0], [0.5, 1.0]], vec![[0.5, 0.2], [0.4, 0.9], [0.2, 0.1]]] {
            let m = SurvivalMap { knots };
            assert!(m.check().is_err());
            for s in [0.1, 0.3, 0.45, 0.9] {
                let _ = m.apply(s);
            }
        }
    }

    #[test]
    fn check_names_a_bad_knot() {
        let e = SurvivalMap { knots: vec![[0.2, 0.5], [0.1, 0.6]] }.check().unwrap_err();
        assert!(e.contains("knot 1"), "{e}");
        let e = SurvivalMap { knots: vec![[0.2, f32::NAN]] }.check().unwrap_err();
        assert!(e.contains("knot 0"), "{e}");
        let e = SurvivalMap { knots: vec![[0.2, 0.5], [0.3, 0.4]] }.check().unwrap_err();
        assert!(e.contains("non-decreasing"), "{e}");
    }
}
