//! The batched step: every active session's rows in one target forward.
//!
//! A step runs in four phases: each speculative session drafts ([`Session::propose`]); the
//! batch schedule chooses every window together ([`spec_decode::schedule::batch`], Algorithm 1
//! across requests, for the sessions it may schedule; the others keep their own rule's window);
//! one stepwise forward scores all rows ([`gemma4::Model::forward_sessions`]: projections, MLP
//! and head once, attention per session over its own cache), with the LM head over all rows at
//! once; then each session concludes on its own rows.
//!
//! Exactness per request: every row of a stepwise forward is bit-identical to the one-token
//! decode step of its session (the row kernels on the CPU give a row the same bits in any
//! batch of up to [`MAX_ROWS`] rows), so a greedy request decodes the same tokens whatever else
//! is in the batch, and a sampled one draws with its own key chain from its own rows.
//! A forward holds at most [`MAX_ROWS`] rows; more sessions than fit run in several forwards.
//!
//! A failure in one session's drafting or verdict ends that session alone; a failed forward
//! ends the sessions whose rows it held (their caches may hold half a write).

use gemma4::Model;
use mlx_core::{concatenate, Array};
use spec_decode::schedule::batch::{batch_windows, BatchCost, Offer};
use spec_decode::Drafter;

use crate::error::{Error, Result};
use crate::session::{Proposal, Rows, Session, StepOut};

/// Rows of one forward at most: the row kernels' bound ([`mlx_core::blas::ROW_LINEAR_MAX_ROWS`]),
/// up to which a row's bits do not depend on the batch.
pub const MAX_ROWS: usize = mlx_core::blas::ROW_LINEAR_MAX_ROWS;

/// A session and the drafter lent to it for this step.
pub struct Member<'a, 'm, 't> {
    /// The session.
    pub session: &'a mut Session<'m, 't>,
    /// Its drafter (none for a plain session).
    pub drafter: Option<&'a mut (dyn Drafter + 'static)>,
}

/// How a batch chooses its windows, and what it has achieved so far.
#[derive(Clone, Debug, Default)]
pub struct BatchSchedule {
    /// The cost of a forward over n rows, in one-row decode steps; `None`: every session keeps
    /// its own rule's window.
    pub cost: Option<BatchCost>,
    /// Tokens emitted over the steps so far, and their cost in decode steps: the batch's rate,
    /// the price a draft must pay for its row.
    tokens: f64,
    spent: f64,
    steps: usize,
}

impl BatchSchedule {
    /// A schedule pricing rows by `cost`.
    pub fn new(cost: Option<BatchCost>) -> BatchSchedule {
        BatchSchedule { cost, ..Default::default() }
    }

    /// Tokens per decode step of time achieved (after two steps; before, each step's own
    /// expected ratio prices its drafts).
    fn rate(&self) -> Option<f64> {
        (self.steps >= 2 && self.spent > 0.0).then(|| self.tokens / self.spent)
    }

    fn record(&mut self, tokens: usize, rows: usize) {
        if let Some(c) = &self.cost {
            // Old steps fade, so the price follows the load as sessions come and go.
            const KEEP: f64 = 0.9;
            self.tokens = self.tokens * KEEP + tokens as f64;
            self.spent = self.spent * KEEP + c.at(rows);
            self.steps += 1;
        }
    }
}

/// One step of every member (see the module docs): one output per member, in order.
pub fn step(target: &Model, members: &mut [Member<'_, '_, '_>], schedule: &mut BatchSchedule) -> Vec<Result<StepOut>> {
    let n = members.len();
    let mut outs: Vec<Option<Result<StepOut>>> = (0..n).map(|_| None).collect();

    // 1. Drafts.
    let mut proposals: Vec<Option<Proposal>> = Vec::with_capacity(n);
    for (i, m) in members.iter_mut().enumerate() {
        match m.session.propose(m.drafter.as_deref_mut()) {
            Ok(Some(p)) => proposals.push(Some(p)),
            Ok(None) => {
                outs[i] = Some(Ok(m.session.ended()));
                proposals.push(None);
            }
            Err(e) => {
                outs[i] = Some(Err(e));
                proposals.push(None);
            }
        }
    }

    // 2. Windows: the batch schedule's for the sessions it may choose for, the rest their own.
    let mut drafts: Vec<usize> = vec![0; n];
    let mut offers: Vec<(usize, Offer)> = Vec::new();
    for (i, p) in proposals.iter().enumerate() {
        let Some(p) = p else { continue };
        let s = &members[i].session;
        match (&schedule.cost, s.offer(p)) {
            (Some(_), Some(survival)) => offers.push((i, Offer { survival })),
            _ => drafts[i] = s.own_window(p),
        }
    }
    if let Some(cost) = &schedule.cost {
        if !offers.is_empty() {
            // Rows of the sessions the schedule does not choose for are taken already.
            let offered: Vec<usize> = offers.iter().map(|(i, _)| *i).collect();
            let fixed: usize =
                (0..n).filter(|i| proposals[*i].is_some() && !offered.contains(i)).map(|i| drafts[i] + 1).sum();
            let list: Vec<Offer> = offers.iter().map(|(_, o)| o.clone()).collect();
            let shifted = ShiftedCost { cost, fixed };
            let windows = batch_windows(&list, &shifted.curve(), schedule.rate(), MAX_ROWS.saturating_sub(fixed));
            for (&(i, _), w) in offers.iter().zip(windows) {
                drafts[i] = w;
            }
        }
    }
    let mut rows: Vec<Option<Rows>> = Vec::with_capacity(n);
    for (i, p) in proposals.into_iter().enumerate() {
        rows.push(match p {
            Some(p) => match members[i].session.keep(p, drafts[i]) {
                Ok(r) => Some(r),
                Err(e) => {
                    outs[i] = Some(Err(e));
                    None
                }
            },
            None => None,
        });
    }

    // 3. Forwards of at most MAX_ROWS rows, in member order; 4. each session concludes.
    let mut group: Vec<usize> = Vec::new();
    let mut group_rows = 0;
    let live: Vec<usize> = (0..n).filter(|&i| rows[i].is_some()).collect();
    for (k, &i) in live.iter().enumerate() {
        let len = rows[i].as_ref().map_or(0, Rows::len);
        group.push(i);
        group_rows += len;
        let next = live.get(k + 1).and_then(|&j| rows[j].as_ref()).map_or(0, Rows::len);
        if k + 1 == live.len() || group_rows + next > MAX_ROWS {
            let emitted = run_group(target, members, &mut rows, &group, &mut outs);
            schedule.record(emitted, group_rows);
            group.clear();
            group_rows = 0;
        }
    }
    outs.into_iter().map(|o| o.unwrap_or_else(|| Err(Error::Batch("a session got no step".into())))).collect()
}

/// The batch cost seen by the scheduled sessions when `fixed` rows are already taken.
struct ShiftedCost<'c> {
    cost: &'c BatchCost,
    fixed: usize,
}

impl ShiftedCost<'_> {
    /// V(fixed + n), normalised so V(1) stays the curve's own (only differences matter).
    fn curve(&self) -> BatchCost {
        if self.fixed == 0 {
            return self.cost.clone();
        }
        let pts = (1..=MAX_ROWS).map(|n| (n, self.cost.at(self.fixed + n) as f32)).collect();
        BatchCost::new(pts).unwrap_or_else(|| self.cost.clone())
    }
}

/// One forward over the rows of `group`, then each member's verdict. Returns the tokens
/// emitted.
fn run_group(
    target: &Model,
    members: &mut [Member<'_, '_, '_>],
    rows: &mut [Option<Rows>],
    group: &[usize],
    outs: &mut [Option<Result<StepOut>>],
) -> usize {
    let mut forward = || -> Result<(Array, Option<Array>)> {
        let tokens: Vec<&Array> = group.iter().filter_map(|&i| rows[i].as_ref().map(Rows::tokens)).collect();
        let lens: Vec<usize> = group.iter().filter_map(|&i| rows[i].as_ref().map(Rows::len)).collect();
        let total: usize = lens.iter().sum();
        let ids = concatenate(&tokens, 0)?.reshape(&[1, total as i32])?;
        let taps = members[group[0]].session.taps();
        let mut caches: Vec<&mut gemma4::Cache> = Vec::with_capacity(group.len());
        // Distinct members' caches, borrowed together.
        let mut rest: &mut [Member<'_, '_, '_>] = members;
        let mut base = 0;
        for &i in group {
            let (_, tail) = rest.split_at_mut(i - base);
            let (m, tail) =
                tail.split_first_mut().ok_or_else(|| Error::Batch("a member index is out of range".into()))?;
            caches.push(m.session.cache_mut());
            rest = tail;
            base = i + 1;
        }
        let out = target.forward_sessions(&ids, &lens, &mut caches, (!taps.is_empty()).then_some(&taps))?;
        let logits = target.logits_from_hidden(&out.hidden)?.squeeze(0)?; // [ΣL, V]
        Ok((logits, out.taps))
    };
    let (logits, taps) = match forward() {
        Ok(x) => x,
        Err(e) => {
            let msg = e.to_string();
            for &i in group {
                outs[i] = Some(Err(Error::Batch(msg.clone())));
            }
            return 0;
        }
    };
    let mut emitted = 0;
    let mut start = 0i32;
    for &i in group {
        let Some(r) = rows[i].take() else { continue };
        let len = r.len() as i32;
        let m = &mut members[i];
        let out = (|| -> Result<StepOut> {
            let l = logits.slice_axis(0, start, start + len)?;
            let t = taps.as_ref().map(|t| t.slice_axis(1, start, start + len)).transpose()?;
            m.session.conclude(m.drafter.as_deref_mut(), r, &l, t.as_ref())
        })();
        if let Ok(o) = &out {
            emitted += o.tokens.len();
        }
        outs[i] = Some(out);
        start += len;
    }
    emitted
}
