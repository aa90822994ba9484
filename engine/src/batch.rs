//! The batched step: every active session's rows in one target forward.
//!
//! A step runs in four phases: each speculative session drafts ([`Session::prepare`]); the
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
use spec_decode::schedule::batch::{batch_windows, Offer};
use spec_decode::Drafter;

pub use crate::batch_schedule::BatchSchedule;
use crate::error::{Error, Result};
use crate::session::{Prepared, Proposal, Rows, Session, StepOut};
use spec_decode::Drafting;

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

/// One step of every member (see the module docs): one output per member, in order.
pub fn step(target: &Model, members: &mut [Member<'_, '_, '_>], schedule: &mut BatchSchedule) -> Vec<Result<StepOut>> {
    let n = members.len();
    let mut outs: Vec<Option<Result<StepOut>>> = (0..n).map(|_| None).collect();

    // 1. Drafts: DSpark drafters propose for many sessions in one forward.
    let mut proposals: Vec<Option<Proposal>> = (0..n).map(|_| None).collect();
    let mut drafting: Vec<Option<Drafting>> = (0..n).map(|_| None).collect();
    let t_step = std::time::Instant::now();
    // The schedule may find that drafting does not pay for some sessions now.
    let scheduled: Vec<usize> = (0..n).filter(|&i| members[i].session.batch_scheduled()).collect();
    let offers: Vec<(f64, usize)> =
        scheduled.iter().map(|&i| (members[i].session.expected_accepted(), members[i].session.idle())).collect();
    let mut caps: Vec<Option<usize>> = vec![None; n];
    // Who drafts; adaptive sessions only where drafting has paid at this batch size.
    let gated: Vec<usize> = scheduled.iter().copied().filter(|&i| members[i].session.adaptive()).collect();
    let may_draft = gated.is_empty() || schedule.may_draft(n);
    for (&i, draft) in scheduled.iter().zip(schedule.drafting(&offers, n)) {
        let held = !may_draft && members[i].session.adaptive();
        caps[i] = (!draft || held).then_some(0);
    }
    for (i, m) in members.iter_mut().enumerate() {
        match m.session.prepare(m.drafter.as_deref(), caps[i]) {
            Ok(Prepared::Ended) => outs[i] = Some(Ok(m.session.ended())),
            Ok(Prepared::Plain) => proposals[i] = Some(Proposal::Plain),
            Ok(Prepared::Draft(d)) if d.max_drafts == 0 => {
                proposals[i] = Some(m.session.proposed(d, None, "")).transpose().unwrap_or_else(|e| {
                    outs[i] = Some(Err(e));
                    None
                })
            }
            Ok(Prepared::Draft(d)) => drafting[i] = Some(d),
            Err(e) => outs[i] = Some(Err(e)),
        }
    }
    let t_draft = std::time::Instant::now();
    let drafted = drafting.iter().filter(|d| d.is_some()).count();
    draft_all(members, &mut drafting, &mut proposals, &mut outs);

    // Every session's drafts evaluated in one pass, then read.
    let pending: Vec<&Array> = proposals.iter().flatten().flat_map(Proposal::pending).collect();
    if !pending.is_empty() {
        if let Err(e) = mlx_core::eval(&pending) {
            let msg = e.to_string();
            for (i, p) in proposals.iter_mut().enumerate() {
                if p.take().is_some() {
                    outs[i] = Some(Err(Error::Batch(msg.clone())));
                }
            }
        }
    }
    let draft_ms = t_draft.elapsed().as_secs_f64() * 1e3;
    for (i, p) in proposals.iter_mut().enumerate() {
        if let Some(prop) = p {
            if let Err(e) = members[i].session.read(prop) {
                outs[i] = Some(Err(e));
                *p = None;
            }
        }
    }

    // 2. Windows: the batch schedule's for the sessions it may choose for, the rest their own.
    let mut drafts: Vec<usize> = vec![0; n];
    let mut offers: Vec<(usize, Offer)> = Vec::new();
    // Rows of the sessions whose windows are their own: taken before the schedule chooses.
    let mut taken = 0;
    for (i, p) in proposals.iter().enumerate() {
        let Some(p) = p else { continue };
        let s = &members[i].session;
        match (&schedule.cost, s.offer(p)) {
            (Some(_), Some(survival)) => offers.push((i, Offer { survival })),
            _ => {
                drafts[i] = s.own_window(p);
                taken += drafts[i] + 1;
            }
        }
    }
    if let (Some(cost), false) = (&schedule.cost, offers.is_empty()) {
        let list: Vec<Offer> = offers.iter().map(|(_, o)| o.clone()).collect();
        let windows = batch_windows(&list, taken, cost, schedule.rate(), MAX_ROWS);
        for (&(i, _), w) in offers.iter().zip(windows) {
            drafts[i] = w;
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
    let (mut forwards, mut forward_ms, mut emitted_all) = (Vec::new(), 0.0, 0);
    let live: Vec<usize> = (0..n).filter(|&i| rows[i].is_some()).collect();
    for (k, &i) in live.iter().enumerate() {
        let len = rows[i].as_ref().map_or(0, Rows::len);
        group.push(i);
        group_rows += len;
        let next = live.get(k + 1).and_then(|&j| rows[j].as_ref()).map_or(0, Rows::len);
        if k + 1 == live.len() || group_rows + next > MAX_ROWS {
            let (emitted, fwd_ms) = run_group(target, members, &mut rows, &group, &mut outs);
            forwards.push(group_rows);
            forward_ms += fwd_ms;
            emitted_all += emitted;
            group.clear();
            group_rows = 0;
        }
    }
    let step_ms = t_step.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(
        "step: {n} sessions, {drafted} drafting ({draft_ms:.1} ms), forwards of {forwards:?} rows ({forward_ms:.1} ms), \
         {emitted_all} tokens in {step_ms:.1} ms"
    );
    if !gated.is_empty() {
        let let_draft = gated.iter().any(|&i| caps[i].is_none());
        schedule.record_measured(n, let_draft, emitted_all, step_ms);
    }
    schedule.record(emitted_all, step_ms, drafted, draft_ms, &forwards, forward_ms);
    outs.into_iter().map(|o| o.unwrap_or_else(|| Err(Error::Batch("a session got no step".into())))).collect()
}

/// The drafts of every session in `drafting`: DSpark drafters in batched forwards of at most
/// [`MAX_ROWS`] block rows (their products stay on the row-invariant kernels, so a session's
/// drafts are the ones it would get alone), other drafters one session at a time.
fn draft_all(
    members: &mut [Member<'_, '_, '_>],
    drafting: &mut [Option<Drafting>],
    proposals: &mut [Option<Proposal>],
    outs: &mut [Option<Result<StepOut>>],
) {
    // Sessions whose drafters share weights draft together: groups of (lead, members).
    let mut families: Vec<Vec<usize>> = Vec::new();
    let mut per_group = MAX_ROWS;
    for i in 0..members.len() {
        if drafting[i].is_none() {
            continue;
        }
        let family = {
            let (head, tail) = members.split_at_mut(i);
            let m = &mut tail[0];
            match m.drafter.as_deref_mut() {
                Some(dr) => match dr.as_dspark() {
                    Some(ds) => {
                        per_group = per_group.min((MAX_ROWS / ds.gamma().max(1)).max(1));
                        let found = families.iter().position(|f| {
                            head[f[0]]
                                .drafter
                                .as_deref_mut()
                                .and_then(|d| d.as_dspark())
                                .is_some_and(|l| l.shares_weights(ds))
                        });
                        Some(found)
                    }
                    None => None,
                },
                None => {
                    outs[i] = Some(Err(Error::Batch("a drafting session has no drafter".into())));
                    drafting[i] = None;
                    continue;
                }
            }
        };
        match family {
            Some(Some(f)) => families[f].push(i),
            Some(None) => families.push(vec![i]),
            None => {
                // Another kind of drafter: alone.
                let m = &mut members[i];
                let (Some(dr), Some(d)) = (m.drafter.as_deref_mut(), drafting[i].take()) else { continue };
                match m.session.draft_alone(d, dr) {
                    Ok(p) => proposals[i] = Some(p),
                    Err(e) => outs[i] = Some(Err(e)),
                }
            }
        }
    }
    let batched: Vec<Vec<usize>> =
        families.iter().flat_map(|f| f.chunks(per_group).map(<[usize]>::to_vec).collect::<Vec<_>>()).collect();
    for group in &batched {
        let result = (|| -> Result<Vec<spec_decode::Proposal>> {
            let mut drafters = Vec::with_capacity(group.len());
            let mut reqs = Vec::with_capacity(group.len());
            for (i, m) in members.iter_mut().enumerate().filter(|(i, _)| group.contains(i)) {
                let Member { session, drafter } = m;
                let d = drafting[i].as_ref().ok_or_else(|| Error::Batch("no drafting state".into()))?;
                let req = session.draft_request(d).ok_or_else(|| Error::Batch("a plain session drafting".into()))?;
                let ds = drafter.as_deref_mut().and_then(|d| d.as_dspark());
                drafters.push(ds.ok_or_else(|| Error::Batch("the drafter is not a DSpark drafter".into()))?);
                reqs.push(req);
            }
            Ok(spec_decode::dspark::propose_batch(&mut drafters, reqs)?)
        })();
        match result {
            Ok(ps) => {
                for (&i, p) in group.iter().zip(ps) {
                    let Some(d) = drafting[i].take() else { continue };
                    let name = members[i].drafter.as_deref().map(|d| d.name()).unwrap_or_default();
                    match members[i].session.proposed(d, Some(p), &name) {
                        Ok(p) => proposals[i] = Some(p),
                        Err(e) => outs[i] = Some(Err(e)),
                    }
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for &i in group.iter() {
                    drafting[i] = None;
                    outs[i] = Some(Err(Error::Batch(msg.clone())));
                }
            }
        }
    }
}

/// One forward over the rows of `group`, then each member's verdict. Returns the tokens
/// emitted and the forward's milliseconds (building and evaluating it).
fn run_group(
    target: &Model,
    members: &mut [Member<'_, '_, '_>],
    rows: &mut [Option<Rows>],
    group: &[usize],
    outs: &mut [Option<Result<StepOut>>],
) -> (usize, f64) {
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
    let t0 = std::time::Instant::now();
    // Each member's rows of the forward, and the plain members' next tokens drawn from theirs,
    // evaluated here in one pass with the forward (one host sync for all plain draws; the
    // forward's time is measured apart from the verdicts').
    let fwd = forward().and_then(|(logits, taps)| {
        let mut parts = Vec::with_capacity(group.len());
        let mut draws = Vec::new();
        // Plain greedy sessions' tokens in one draw over their rows (one row each).
        let greedy_rows: Vec<(usize, usize)> = {
            let mut start = 0;
            let mut out = Vec::new();
            for &i in group {
                let Some(r) = rows[i].as_ref() else { continue };
                if members[i].session.draws_greedy(r) {
                    out.push((i, start));
                }
                start += r.len();
            }
            out
        };
        let greedy = match greedy_rows.len() {
            0 | 1 => None,
            n if n == logits.dim(0)? as usize => crate::plain::greedy_tokens(&logits)?,
            n => {
                let at: Vec<u32> = greedy_rows.iter().map(|&(_, row)| row as u32).collect();
                crate::plain::greedy_tokens(&logits.take(&Array::from_slice(&at, &[n as i32])?, 0)?)?
            }
        };
        if greedy.is_some() {
            target.check_first_logits(&logits)?;
        }
        let mut start = 0i32;
        for &i in group {
            let Some(r) = rows[i].as_ref() else { continue };
            let len = r.len() as i32;
            let l = logits.slice_axis(0, start, start + len)?;
            let t = taps.as_ref().map(|t| t.slice_axis(1, start, start + len)).transpose()?;
            start += len;
            if greedy.is_some() && members[i].session.draws_greedy(r) {
                parts.push((i, l, t));
                continue;
            }
            // A session whose draw fails ends alone (its conclusion reports why).
            match members[i].session.draw(r, &l) {
                Ok(d) => draws.extend(d),
                Err(e) => {
                    outs[i] = Some(Err(e));
                    rows[i] = None;
                    continue;
                }
            }
            parts.push((i, l, t));
        }
        let mut all = vec![&logits];
        all.extend(taps.as_ref());
        all.extend(draws.iter());
        all.extend(greedy.as_ref());
        mlx_core::eval(&all)?;
        if let Some(g) = &greedy {
            let tokens = g.to_vec::<u32>()?;
            // One token per greedy row, in order (all rows, when every row is a greedy one).
            for (j, &(i, _)) in greedy_rows.iter().enumerate() {
                let token = tokens.get(j).copied().ok_or_else(|| Error::Batch("a greedy row is missing".into()))?;
                members[i].session.drawn_greedy(token);
            }
        }
        Ok(parts)
    });
    let forward_ms = t0.elapsed().as_secs_f64() * 1e3;
    let parts = match fwd {
        Ok(x) => x,
        Err(e) => {
            let msg = e.to_string();
            for &i in group {
                outs[i] = Some(Err(Error::Batch(msg.clone())));
            }
            return (0, forward_ms);
        }
    };
    let mut emitted = 0;
    for (i, l, t) in parts {
        let Some(r) = rows[i].take() else { continue };
        let m = &mut members[i];
        let out = m.session.conclude(m.drafter.as_deref_mut(), r, &l, t.as_ref());
        if let Ok(o) = &out {
            emitted += o.tokens.len();
        }
        outs[i] = Some(out);
    }
    (emitted, forward_ms)
}
