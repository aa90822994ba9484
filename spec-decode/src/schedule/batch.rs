//! Algorithm 1 across requests: the verify windows of every session in one batched forward,
//! chosen together against the cost of the batch's total rows.
//!
//! Each session contributes its anchor row (one token whatever happens: the correction or
//! bonus) and offers its drafts with calibrated survivals a_{s,0} ≥ a_{s,1} ≥ … (the chance
//! that draft j and all before it are accepted, so its expected tokens). With V(n) the cost of a
//! forward over n rows, in one-row decode steps, draft positions are admitted one at a time, the
//! most valuable first, while the best one left pays for its marginal cost at the batch's price
//! λ: a > λ · (V(n + 1) − V(n)). At low load the marginal cost of a row is small and windows
//! grow; at high load (many anchor rows, the cost curve steeper) they shrink down to plain
//! steps.
//!
//! Each window stays a stopping time of its own session's drafts: a session's draft j is
//! weighed only once drafts 0..j were admitted, on its own survival a_{s,j} (which reads drafts
//! 0..=j) and on other sessions' values, which are independent of this session's target
//! randomness; nothing looks past a draft that was not admitted. So speculative sampling stays
//! exact per request.

use std::collections::BinaryHeap;

/// The measured cost of a stepwise forward over n rows, n = 1, 2, …, in one-row decode steps
/// (`dspark profile`'s batch curve), linearly interpolated between measured row counts and
/// extended along its last slope past the largest.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchCost {
    /// (rows, cost) at the measured row counts, rows increasing, the first at 1 row.
    points: Vec<(usize, f32)>,
}

impl BatchCost {
    /// A curve through measured (rows, cost) points; `None` unless the rows increase from 1
    /// and every cost is positive and finite.
    pub fn new(points: Vec<(usize, f32)>) -> Option<BatchCost> {
        let increasing = points.windows(2).all(|w| w[0].0 < w[1].0);
        let finite = points.iter().all(|&(_, c)| c.is_finite() && c > 0.0);
        (points.first().is_some_and(|p| p.0 == 1) && increasing && finite).then_some(BatchCost { points })
    }

    /// The curve of a per-row cost table `cost[n − 1]` = V(n) (a session's verify profile).
    pub fn from_table(cost: &[f32]) -> Option<BatchCost> {
        BatchCost::new(cost.iter().enumerate().map(|(i, &c)| (i + 1, c)).collect())
    }

    /// V(n) for n ≥ 1 rows.
    pub fn at(&self, n: usize) -> f64 {
        let p = &self.points;
        let k = p.partition_point(|&(rows, _)| rows <= n);
        let (lo, hi) = match k {
            0 => return f64::from(p[0].1),
            k if k == p.len() && p.len() >= 2 => (p[k - 2], p[k - 1]),
            k if k == p.len() => return f64::from(p[0].1) * n as f64,
            k => (p[k - 1], p[k]),
        };
        let slope = (f64::from(hi.1) - f64::from(lo.1)) / (hi.0 - lo.0) as f64;
        (f64::from(lo.1) + slope * (n as f64 - lo.0 as f64)).max(f64::MIN_POSITIVE)
    }
}

/// One session's offer to the batch.
#[derive(Clone, Debug, Default)]
pub struct Offer {
    /// Calibrated survivals of its drafts, in order (empty: a plain step).
    pub survival: Vec<f32>,
}

#[derive(PartialEq)]
struct Candidate {
    value: f32,
    session: usize,
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    // The highest value first; among equal values the earlier session, so the order is fixed.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.value.total_cmp(&other.value).then(other.session.cmp(&self.session))
    }
}

/// Drafts each session verifies (`offers[s]`'s leading `windows[s]`), admitted across
/// sessions by value while each pays at `price` tokens per decode step (the batch's achieved
/// rate; `None`: the offers' own expected tokens per cost so far), never more than `max_rows`
/// rows in all. `taken` rows of the batch are already spoken for (sessions whose windows are
/// their own); the offers' anchors come on top of them and are always in.
pub fn batch_windows(
    offers: &[Offer],
    taken: usize,
    cost: &BatchCost,
    price: Option<f64>,
    max_rows: usize,
) -> Vec<usize> {
    let mut windows = vec![0; offers.len()];
    let mut rows = taken + offers.len();
    let mut expected = offers.len() as f64;
    let mut heap: BinaryHeap<Candidate> = offers
        .iter()
        .enumerate()
        .filter_map(|(s, o)| o.survival.first().map(|&value| Candidate { value, session: s }))
        .collect();
    while let Some(best) = heap.pop() {
        if rows >= max_rows || !(best.value.is_finite() && best.value > 0.0) {
            break;
        }
        let (now, next) = (cost.at(rows), cost.at(rows + 1));
        let lambda = price.filter(|p| p.is_finite() && *p > 0.0).unwrap_or(expected / now);
        if f64::from(best.value) <= lambda * (next - now) {
            break;
        }
        let s = best.session;
        windows[s] += 1;
        rows += 1;
        expected += f64::from(best.value);
        if let Some(&value) = offers[s].survival.get(windows[s]) {
            heap.push(Candidate { value, session: s });
        }
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(s: &[f32]) -> Offer {
        Offer { survival: s.to_vec() }
    }

    #[test]
    fn the_curve_interpolates_and_extends() {
        let c = BatchCost::new(vec![(1, 1.0), (2, 1.1), (4, 1.3), (8, 2.1)]).unwrap();
        assert!((c.at(1) - 1.0).abs() < 1e-9);
        assert!((c.at(3) - 1.2).abs() < 1e-6);
        assert!((c.at(6) - 1.7).abs() < 1e-6);
        assert!((c.at(12) - 2.9).abs() < 1e-6, "past the last point along its slope");
        assert!(BatchCost::new(vec![(2, 1.0)]).is_none(), "must start at one row");
        assert!(BatchCost::new(vec![(1, 1.0), (1, 2.0)]).is_none());
        assert!(BatchCost::from_table(&[1.0, f32::NAN]).is_none());
    }

    #[test]
    fn admits_the_most_valuable_drafts_across_sessions() {
        // A flat curve, then steep: two rows are almost free, the third costs a whole step.
        let c = BatchCost::new(vec![(1, 1.0), (4, 1.15), (5, 2.2)]).unwrap();
        let offers = [offer(&[0.9, 0.5]), offer(&[0.95, 0.8])];
        // Rows 3 and 4 cost 0.05 each, the fifth 1.05: the two best drafts go in.
        assert_eq!(batch_windows(&offers, 0, &c, Some(2.0), 64), vec![1, 1]);
        // At a lower price the fifth row pays for the 0.8 draft too.
        assert_eq!(batch_windows(&offers, 0, &c, Some(0.5), 64), vec![1, 2]);
        assert_eq!(batch_windows(&offers, 0, &c, Some(2.0), 3), vec![0, 1], "the row cap binds");
    }

    #[test]
    fn windows_shrink_as_load_grows() {
        // Linear cost 0.1 per extra row up to 8 rows, then 1 per row (compute-bound).
        let c = BatchCost::new(vec![(1, 1.0), (8, 1.7), (16, 9.7)]).unwrap();
        let one = batch_windows(&[offer(&[0.9, 0.8, 0.7, 0.6])], 0, &c, None, 64);
        assert_eq!(one, vec![4], "alone, every likely draft pays");
        let many: Vec<Offer> = (0..12).map(|_| offer(&[0.9, 0.8, 0.7, 0.6])).collect();
        let w = batch_windows(&many, 0, &c, None, 64);
        assert!(w.iter().all(|&k| k == 0), "12 anchors already past the knee: plain steps, got {w:?}");
        // One offer, with 11 rows taken by sessions whose windows are their own: past the knee
        // a row costs a whole step, which a draft does not pay at 2 tokens a step.
        assert_eq!(batch_windows(&many[..1], 11, &c, Some(2.0), 64), vec![0]);
        assert_eq!(batch_windows(&many[..1], 0, &c, Some(2.0), 64), vec![4]);
    }

    #[test]
    fn never_looks_past_a_draft_it_did_not_admit() {
        // Session 0's second draft would pay but its first does not: it is never reached.
        let c = BatchCost::new(vec![(1, 1.0), (2, 1.5), (3, 1.6)]).unwrap();
        assert_eq!(batch_windows(&[offer(&[0.3, 0.29])], 0, &c, Some(1.0), 64), vec![0]);
        // Zero and NaN survivals are never admitted.
        assert_eq!(batch_windows(&[offer(&[0.0, 0.9]), offer(&[f32::NAN])], 0, &c, Some(0.1), 64), vec![0, 0]);
    }
}
