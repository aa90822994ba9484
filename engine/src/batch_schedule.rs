//! What a batch knows when it schedules: the cost curve of its forwards, and what its steps
//! have cost and yielded so far.
//!
//! Two decisions use it, both Algorithm 1's trade of expected tokens against measured cost:
//! - **which sessions draft** this step ([`BatchSchedule::drafting`]): drafting costs the
//!   batched drafter forward (a fixed part and a part per session) and the rows each window
//!   adds; the most promising sessions draft while the drafts they are expected to get accepted
//!   (from their past rounds) are worth more at the batch's achieved rate. Decided before any
//!   draft is seen, from past rounds only.
//! - **the windows** of the sessions that drafted ([`spec_decode::schedule::batch`]), priced in
//!   forward cost units at the batch's achieved tokens per unit ([`BatchSchedule::rate`]).
//!
//! At low load a row is cheap and the batch's rate is a session's own, so sessions draft full
//! windows; at high load rows cost more and the rate is the batch's, so weak drafters stop
//! drafting and windows shrink, down to plain steps.

use spec_decode::schedule::batch::BatchCost;

/// Every this many steps, the sessions that have not drafted for as long draft again, together
/// (one drafter forward for all of them), so their expected acceptance and the drafting cost
/// stay measured as the load changes.
pub const PROBE_AFTER: usize = 16;

/// Exponential forgetting of old steps, so the prices follow the load as sessions come and go.
const KEEP: f64 = 0.9;

/// A running mean that forgets ([`KEEP`]).
#[derive(Clone, Copy, Debug, Default)]
struct Fading {
    sum: f64,
    weight: f64,
}

impl Fading {
    fn add(&mut self, value: f64, weight: f64) {
        self.sum = self.sum * KEEP + value;
        self.weight = self.weight * KEEP + weight;
    }

    fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

/// How a batch chooses its windows and who drafts, and what it has measured (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct BatchSchedule {
    /// The cost of a forward over n rows, in one-row decode steps; `None`: every session drafts
    /// and keeps its own rule's window.
    pub cost: Option<BatchCost>,
    /// Tokens per unit of forward cost (the window price).
    per_unit: Fading,
    /// Tokens per millisecond of whole steps (the drafting price).
    per_ms: Fading,
    /// Milliseconds of a drafting phase with one session drafting.
    draft_first: Fading,
    /// Milliseconds each further drafting session adds.
    draft_more: Fading,
    /// Milliseconds per unit of forward cost.
    unit_ms: Fading,
    steps: usize,
}

impl BatchSchedule {
    /// A schedule pricing rows by `cost`.
    pub fn new(cost: Option<BatchCost>) -> BatchSchedule {
        BatchSchedule { cost, ..Default::default() }
    }

    /// Tokens per unit of forward cost achieved (after two steps; before, each step's own
    /// expected ratio prices its drafts).
    pub fn rate(&self) -> Option<f64> {
        self.per_unit.mean().filter(|_| self.steps >= 2)
    }

    /// Which of the sessions the schedule chooses for draft this step: `sessions[i]` =
    /// (drafts it is expected to get accepted, steps since it last drafted), with `anchors` rows
    /// in the batch already. The most promising sessions draft, as many as maximise expected
    /// tokens less their cost at the batch's rate: the batched drafter forward (a fixed part
    /// plus a part per session, as measured) and the rows each window adds. Every session
    /// drafts without a cost curve or before two steps were measured, and sessions idle for
    /// [`PROBE_AFTER`] steps draft again on every [`PROBE_AFTER`]th step.
    pub fn drafting(&self, sessions: &[(f64, usize)], anchors: usize) -> Vec<bool> {
        let (Some(cost), Some(price), Some(unit), Some(first)) =
            (&self.cost, self.per_ms.mean(), self.unit_ms.mean(), self.draft_first.mean())
        else {
            return vec![true; sessions.len()];
        };
        if self.steps < 2 {
            return vec![true; sessions.len()];
        }
        let more = self.draft_more.mean().unwrap_or(first);
        let draft_ms = |k: usize| if k == 0 { 0.0 } else { first + more * (k - 1) as f64 };
        let probe = self.steps.is_multiple_of(PROBE_AFTER);
        let mut chosen: Vec<bool> = sessions.iter().map(|&(_, idle)| probe && idle >= PROBE_AFTER).collect();
        let forced = chosen.iter().filter(|&&c| c).count();
        // Each window adds about the accepted drafts plus the first rejected one.
        let window_ms = |e: f64| (cost.at(anchors + (e + 1.0).ceil() as usize) - cost.at(anchors)) * unit;
        let mut order: Vec<usize> = (0..sessions.len()).filter(|&i| !chosen[i]).collect();
        order.sort_by(|&a, &b| sessions[b].0.total_cmp(&sessions[a].0).then(a.cmp(&b)));
        let (mut best, mut best_k, mut gain) = (0.0, 0, 0.0);
        for (k, &i) in order.iter().enumerate() {
            let e = sessions[i].0;
            gain += e - price * window_ms(e);
            let net = gain - price * (draft_ms(forced + k + 1) - draft_ms(forced));
            if net > best {
                (best, best_k) = (net, k + 1);
            }
        }
        for &i in &order[..best_k] {
            chosen[i] = true;
        }
        tracing::debug!(
            "drafting: rate {price:.3} tok/ms, drafting {first:.2} ms + {more:.2} ms a session, {unit:.2} ms a cost unit, \
             expected {:?} -> {best_k} of {} chosen",
            sessions.iter().map(|s| (s.0 * 100.0).round() / 100.0).collect::<Vec<_>>(),
            order.len()
        );
        chosen
    }

    /// Records a step: `tokens` emitted in `step_ms`; `drafting` sessions drafted in `draft_ms`;
    /// forwards over `rows` (one entry per forward) took `forward_ms` in all.
    pub fn record(
        &mut self,
        tokens: usize,
        step_ms: f64,
        drafting: usize,
        draft_ms: f64,
        rows: &[usize],
        forward_ms: f64,
    ) {
        let Some(cost) = &self.cost else { return };
        let units: f64 = rows.iter().map(|&n| cost.at(n)).sum();
        if units > 0.0 {
            self.per_unit.add(tokens as f64, units);
            self.unit_ms.add(forward_ms, units);
        }
        if step_ms > 0.0 {
            self.per_ms.add(tokens as f64, step_ms);
        }
        match (drafting, self.draft_first.mean()) {
            (0, _) => {}
            (1, _) => self.draft_first.add(draft_ms, 1.0),
            (k, Some(first)) => self.draft_more.add((draft_ms - first).max(0.0), (k - 1) as f64),
            (k, None) => self.draft_first.add(draft_ms / k as f64, 1.0),
        }
        self.steps += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve() -> BatchCost {
        BatchCost::new(vec![(1, 1.0), (8, 1.7), (16, 3.0), (64, 12.0)]).unwrap()
    }

    #[test]
    fn drafts_until_measured() {
        let s = BatchSchedule::new(Some(curve()));
        assert_eq!(s.drafting(&[(0.0, 0), (0.0, 0)], 30), vec![true, true]);
        assert_eq!(BatchSchedule::new(None).drafting(&[(0.0, 0)], 30), vec![true]);
    }

    #[test]
    fn the_most_promising_sessions_draft_while_they_pay() {
        // Alone: 3 tokens a 10 ms step, 3 ms of it drafting, the forward 5 ms for 4 rows.
        let mut s = BatchSchedule::new(Some(curve()));
        for _ in 0..5 {
            s.record(3, 10.0, 1, 3.0, &[4], 5.0);
        }
        assert_eq!(s.drafting(&[(2.0, 0)], 1), vec![true], "two accepted drafts pay for 3 ms of drafting");
        // Sixteen sessions: 24 tokens a 20 ms step; drafting 1 ms for one session, +0.2 ms each.
        let mut busy = BatchSchedule::new(Some(curve()));
        for k in [1, 4, 1, 8, 1, 4] {
            busy.record(24, 20.0, k, 1.0 + 0.2 * (k - 1) as f64, &[32], 15.0);
        }
        // One likely session alone does not pay for the 1 ms forward; two share it.
        assert_eq!(busy.drafting(&[(0.3, 0), (4.0, 0)], 16), vec![false, false]);
        let got = busy.drafting(&[(0.3, 0), (4.0, 0), (0.2, 0), (3.5, 0)], 16);
        assert_eq!(got, vec![false, true, false, true], "the two likely sessions share the fixed cost");
        // Six steps recorded: not a probing step; then ten more make sixteen.
        assert_eq!(busy.drafting(&[(0.3, 0), (0.2, PROBE_AFTER)], 16), vec![false, false]);
        for _ in 0..10 {
            busy.record(24, 20.0, 0, 0.0, &[16], 10.0);
        }
        assert_eq!(
            busy.drafting(&[(0.3, 0), (0.2, PROBE_AFTER)], 16),
            vec![false, true],
            "idle sessions probe together"
        );
        assert_eq!(busy.drafting(&[(0.5, 0)], 16), vec![false], "half a draft does not pay for a forward");
    }
}
