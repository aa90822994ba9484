//! What a batch knows when it schedules: the cost curve of its forwards, and what its steps
//! have cost and yielded so far.
//!
//! Two decisions use it, both Algorithm 1's trade of expected tokens against measured cost:
//! - **whether a session drafts** this step ([`BatchSchedule::drafts`]): drafting costs the
//!   session's share of the batched drafter forward and the rows its window adds; it pays when
//!   the drafts it is expected to get accepted (from its past rounds) are worth more at the
//!   batch's achieved rate. Decided before any draft is seen, from past rounds only.
//! - **the windows** of the sessions that drafted ([`spec_decode::schedule::batch`]), priced in
//!   forward cost units at the batch's achieved tokens per unit ([`BatchSchedule::rate`]).
//!
//! At low load a row is cheap and the batch's rate is a session's own, so sessions draft full
//! windows; at high load rows cost more and the rate is the batch's, so weak drafters stop
//! drafting and windows shrink, down to plain steps.

use spec_decode::schedule::batch::BatchCost;

/// A session that has not drafted for this many steps drafts again, so its expected
/// acceptance and the drafting cost stay measured as the load changes.
pub const PROBE_AFTER: usize = 8;

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
    /// Milliseconds of drafting per drafting session.
    draft_ms: Fading,
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

    /// Whether a session expected to get `expected` drafts accepted, which has not drafted for
    /// `idle` steps, should draft this step, with `anchors` rows in the batch already: yes
    /// unless the schedule has measured that its drafting and window cost more than they bring
    /// at the batch's rate. Sessions always draft without a cost curve, before two steps were
    /// measured, and after [`PROBE_AFTER`] steps without drafting.
    pub fn drafts(&self, expected: f64, idle: usize, anchors: usize) -> bool {
        if idle >= PROBE_AFTER {
            return true;
        }
        let (Some(cost), Some(price), Some(draft), Some(unit)) =
            (&self.cost, self.per_ms.mean(), self.draft_ms.mean(), self.unit_ms.mean())
        else {
            return true;
        };
        if self.steps < 2 {
            return true;
        }
        // The window adds about the accepted drafts plus the first rejected one.
        let rows = (expected + 1.0).ceil() as usize;
        let window_ms = (cost.at(anchors + rows) - cost.at(anchors)) * unit;
        expected > price * (draft + window_ms)
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
        if drafting > 0 {
            self.draft_ms.add(draft_ms, drafting as f64);
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
        assert!(s.drafts(0.0, 0, 30));
        assert!(BatchSchedule::new(None).drafts(0.0, 0, 30));
    }

    #[test]
    fn a_weak_drafter_stops_drafting_when_the_batch_is_fast() {
        let mut s = BatchSchedule::new(Some(curve()));
        // One session: 3 tokens a 10 ms step, 3 ms of it drafting, the forward 5 ms for 4 rows.
        for _ in 0..5 {
            s.record(3, 10.0, 1, 3.0, &[4], 5.0);
        }
        assert!(s.drafts(2.0, 0, 1), "alone, two accepted drafts pay for 3 ms of drafting");
        // Sixteen sessions: 24 tokens a 20 ms step, 0.8 ms a drafting session.
        let mut busy = BatchSchedule::new(Some(curve()));
        for _ in 0..5 {
            busy.record(24, 20.0, 16, 12.8, &[32], 15.0);
        }
        assert!(!busy.drafts(0.5, 0, 16), "half a draft accepted does not pay at 1.2 tokens a millisecond");
        assert!(busy.drafts(4.0, 0, 16), "four do");
        assert!(busy.drafts(0.5, PROBE_AFTER, 16), "a session idle for long probes again");
    }
}
