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
//!
//! Above both, what was measured decides whether drafting happens at all: for each batch size
//! class (1, 2–3, 4–7, … sessions in the step), the tokens per millisecond of its steps where the schedule let
//! sessions draft against those of its steps where none did, each arm tried again every
//! [`PROBE_AFTER`] steps. Where drafting costs more than it saves (a tiny target on a CPU,
//! where a decode step is as cheap as a proposal; many sessions, where rows are no longer
//! cheap) the batch then decodes plainly instead of losing to plain decoding. A session
//! stepping alone (`dspark generate`, a server with one request) is the batch size 1.

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

/// The last [`Recent::KEEP`] steps of one kind: (tokens, milliseconds).
#[derive(Clone, Debug, Default)]
struct Recent(std::collections::VecDeque<(f64, f64)>);

impl Recent {
    const KEEP: usize = 12;

    fn add(&mut self, tokens: f64, ms: f64) {
        if self.0.len() == Self::KEEP {
            self.0.pop_front();
        }
        self.0.push_back((tokens, ms));
    }

    /// Tokens per millisecond: mean tokens over the median step time, so one step slowed by
    /// something else on the machine does not decide for the next dozen.
    fn rate(&self) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = self.0.iter().map(|s| s.1).collect();
        ms.sort_by(f64::total_cmp);
        let tokens = self.0.iter().map(|s| s.0).sum::<f64>() / self.0.len() as f64;
        Some(tokens / ms[ms.len() / 2].max(1e-9))
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
    /// By batch size class ([`size_class`]): its recent steps with and without drafting.
    arms: std::collections::BTreeMap<u32, Arms>,
}

/// The class a batch of `sessions` is measured in: 1, 2–3, 4–7, 8–15, … sessions. A batch's
/// size moves as requests come and go; classes keep each one's measurements from being spread
/// over every size it passes through (each would explore on its own).
fn size_class(sessions: usize) -> u32 {
    sessions.max(1).ilog2()
}

/// A batch size's recent steps where sessions drafted and where none did.
#[derive(Clone, Debug, Default)]
struct Arms {
    drafting: Recent,
    plain: Recent,
    steps: usize,
    drafted: usize,
}

impl Arms {
    /// Whether this step may draft: three drafting steps first (two counted), then two plain
    /// ones (one counted), then whichever has given more tokens per millisecond, the other
    /// tried again every [`PROBE_AFTER`] steps.
    fn may_draft(&self) -> bool {
        let plain_steps = self.steps - self.drafted;
        let (Some(drafting), Some(plain)) = (self.drafting.rate(), self.plain.rate()) else {
            return self.drafted < 3 || plain_steps >= 2;
        };
        let better = drafting >= plain;
        let probe = self.steps.is_multiple_of(PROBE_AFTER);
        tracing::debug!("measured: {drafting:.3} tok/ms drafting, {plain:.3} plain -> drafting {}", better != probe);
        better != probe
    }

    fn record(&mut self, drafted: bool, tokens: usize, step_ms: f64) {
        // Each arm's first step is not counted: it pays one-off set-up (the drafter's first
        // proposal, a sleeping helper thread) that later steps do not.
        let earlier = if drafted { self.drafted } else { self.steps - self.drafted };
        if earlier > 0 {
            let arm = if drafted { &mut self.drafting } else { &mut self.plain };
            arm.add(tokens as f64, step_ms);
        }
        self.steps += 1;
        self.drafted += usize::from(drafted);
    }
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

    /// Whether any session may draft in a step of `sessions` sessions: by what steps of about
    /// that size (1, 2–3, 4–7, … sessions) have measured (see the module docs; `true` until both
    /// arms are measured, which takes three drafting steps and then two plain ones). Decided
    /// from past steps only, before any draft is seen.
    pub fn may_draft(&self, sessions: usize) -> bool {
        self.arms.get(&size_class(sessions)).is_none_or(Arms::may_draft)
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

    /// Records what a step of `sessions` sessions, some of them the schedule's to decide for,
    /// yielded for [`Self::may_draft`]: whether the schedule let them draft (`drafted`), and
    /// `tokens` emitted in `step_ms`.
    pub fn record_measured(&mut self, sessions: usize, drafted: bool, tokens: usize, step_ms: f64) {
        if sessions > 0 && step_ms > 0.0 {
            self.arms.entry(size_class(sessions)).or_default().record(drafted, tokens, step_ms);
        }
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

    /// A batch size drafts while its drafting steps yield more tokens per millisecond than its
    /// plain steps, and tries the other arm every PROBE_AFTER steps; each size on its own.
    #[test]
    fn drafting_happens_only_while_it_has_paid() {
        // Alone: drafting 3 tokens in 4 ms (0.75 tok/ms) against 1 token a ms.
        let mut s = BatchSchedule::new(None);
        let mut chosen = Vec::new();
        for _ in 0..48 {
            let d = s.may_draft(1);
            chosen.push(d);
            s.record_measured(1, d, if d { 3 } else { 1 }, if d { 4.0 } else { 1.0 });
        }
        assert_eq!(&chosen[..5], &[true, true, true, false, false], "three drafting steps, then two plain");
        let drafted_later: Vec<usize> = (5..48).filter(|&i| chosen[i]).collect();
        assert_eq!(drafted_later, vec![16, 32], "plain wins; drafting is probed every {PROBE_AFTER} steps");
        assert!(s.may_draft(8), "another batch size has measured nothing yet");
        assert_eq!((size_class(1), size_class(3), size_class(4), size_class(15), size_class(16)), (0, 1, 2, 3, 4));
        // Eight sessions: drafting 40 tokens in 10 ms beats 8 tokens in 4 ms: plain only to probe.
        let mut plain = Vec::new();
        for i in 0..48 {
            let d = s.may_draft(8);
            if !d {
                plain.push(i);
            }
            s.record_measured(8, d, if d { 40 } else { 8 }, if d { 10.0 } else { 4.0 });
        }
        assert_eq!(plain, vec![3, 4, 16, 32], "the plain arm measured, then probed");
        s.record_measured(1, false, 1, 1.0); // past the probe at its 48th step
        assert!(!s.may_draft(1), "batch size 1 keeps what it measured");
    }
}
