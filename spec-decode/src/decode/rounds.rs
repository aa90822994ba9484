//! The per-round stepper: one request's state between rounds, and the round itself, in its
//! steps: draft, the optional confidence read and prune, the verify forward, the verdict (one
//! host read), emit, commit the anchor and accepted rows, roll back the rejected tips.

use std::time::Instant;

use gemma4::{Cache, Model, TapSet};
use mlx_core::random::KeyChain;
use mlx_core::{concatenate, Array};

use super::{FinishReason, Prefilled, SpecConfig, SpecOutput};
use crate::calibration::ConfSample;
use crate::drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
use crate::error::{Error, Result};
use crate::schedule::draft_cap::DraftCap;
use crate::schedule::request_rate::RequestRate;
use crate::schedule::Cut;
use crate::stats::SpecStats;
use crate::verify::rule::VerifyRule;
use crate::verify::{greedy_verdict, sampled_verdict, Judged};

/// One speculative request as a value that advances one round at a time, so a caller (a
/// server's engine) can interleave requests, cancel between rounds and stream what each round
/// emits. It holds only per-request state (target cache, sampler keys, emitted tokens, stats);
/// the target and the drafter are passed to every [`SpecRounds::round`], so several requests
/// can share one target. The drafter passed must be the one [`SpecRounds::start`] reset, with
/// no other request's rounds in between.
///
/// [`crate::speculative_generate`] and [`crate::decode_from`] are this stepper run to the end, so stepping
/// gives the same tokens.
pub struct SpecRounds {
    cfg: SpecConfig,
    rule: VerifyRule,
    gamma: usize,
    cut: Option<Cut>,
    /// Under the throughput schedule: how many drafts to propose, from recent windows.
    draft_cap: Option<DraftCap>,
    /// Under the throughput schedule: tokens per decode step so far, which prices each draft.
    rate: RequestRate,
    taps: TapSet,
    greedy: bool,
    stats: SpecStats,
    keys: KeyChain,
    cache: Cache,
    conf_samples: Vec<ConfSample>,
    pending: u32,
    tokens: Vec<u32>,
    t1: Instant,
    finish: Option<FinishReason>,
}

/// A round about to draft ([`SpecRounds::prepare`]).
pub struct Drafting {
    /// The round's anchor, the pending token // `[1]`
    pub anchor: Array,
    /// Drafts the round may propose (0: a plain step).
    pub max_drafts: usize,
}

/// A round's drafts before the window is chosen ([`SpecRounds::propose`]).
pub struct Proposed {
    /// The round's anchor, the pending token // `[1]`
    anchor: Array,
    proposal: Option<Proposal>,
    /// The drafts' confidences, read when the request prunes.
    conf: Option<Vec<f32>>,
    offered: usize,
}

impl Proposed {
    /// The arrays the round reads next (drafts, draft distributions, confidences), for a
    /// caller that evaluates several requests' drafts together.
    pub fn pending(&self) -> Vec<&Array> {
        match &self.proposal {
            Some(p) => std::iter::once(&p.tokens).chain(p.q.as_ref()).chain(p.confidence.as_ref()).collect(),
            None => Vec::new(),
        }
    }
}

/// A round's verify window ([`SpecRounds::keep`]): the anchor and the kept drafts.
pub struct Window {
    /// [pending, drafts…] // `[d+1]` uint32
    pub tokens: Array,
    proposal: Option<Proposal>,
    /// d, the drafts in the window.
    pub drafts: usize,
    round_conf: Vec<f32>,
}

/// What a round's verify forward gives the later steps.
struct Verified {
    /// The target's scores of the window // `[d+1, V]`
    logits: Array,
    /// The window's tapped rows, of which the anchor and accepted ones are committed
    /// // `[1, d+1, m·H]`
    taps: Option<Array>,
}

impl SpecRounds {
    /// Checks the settings against the drafter and resets it with the prefill's tapped rows
    /// (`ctx`, normally `pre`'s own; passed apart so a caller can free them once projected).
    pub fn start(
        target: &Model,
        drafter: &mut dyn Drafter,
        pre: &Prefilled,
        ctx: Option<Array>,
        cfg: &SpecConfig,
    ) -> Result<SpecRounds> {
        Self::start_with_rule(target, drafter, pre, ctx, cfg, VerifyRule::Exact)
    }

    pub(crate) fn start_with_rule(
        target: &Model,
        drafter: &mut dyn Drafter,
        pre: &Prefilled,
        ctx: Option<Array>,
        cfg: &SpecConfig,
        rule: VerifyRule,
    ) -> Result<SpecRounds> {
        let vocab = target.config().vocab_size;
        let gamma = cfg.gamma_for(drafter)?;
        let gen = &cfg.generate;
        gen.sampler.validate(vocab)?;
        if cfg.pruning.is_active() && !drafter.has_confidence() {
            return Err(Error::Settings {
                field: "pruning",
                detail: format!(
                    "{} has no confidence head, so its drafts cannot be pruned by confidence",
                    drafter.name()
                ),
            });
        }
        let cut = cfg.pruning.resolve(drafter.thresholds(), gamma)?;
        let taps = drafter.taps();
        if taps != pre.taps {
            return Err(Error::Contract("the prefill was tapped for a different drafter".into()));
        }
        let stats = SpecStats {
            prompt_tokens: pre.prompt_tokens,
            prefill_forwards: pre.forwards,
            prefill_ms: pre.ms,
            ..Default::default()
        };
        let keys = KeyChain::new(gen.seed)?;
        let cache = pre.cache.clone();
        let t1 = Instant::now();
        drafter.reset(ctx.as_ref(), pre.committed)?;
        drop(ctx);
        Ok(SpecRounds {
            cfg: cfg.clone(),
            rule,
            gamma,
            draft_cap: match &cut {
                Some(Cut::Throughput(plan)) if plan.draft_cap => Some(DraftCap::new(gamma)),
                _ => None,
            },
            cut,
            rate: RequestRate::default(),
            taps,
            greedy: gen.sampler.is_greedy(),
            stats,
            keys,
            cache,
            conf_samples: Vec::new(),
            pending: pre.pending,
            tokens: Vec::new(),
            t1,
            finish: None,
        })
    }

    /// The tokens emitted so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The statistics so far (`emitted`, `stops` and `decode_ms` are set by [`Self::finish`]).
    pub fn stats(&self) -> &SpecStats {
        &self.stats
    }

    /// Why the request ended, once it has.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finish
    }

    /// Runs one round (draft, verify, accept, emit, commit, roll back); `on_token` sees each
    /// emitted token. Returns why the request ended once it has (and then again on every call,
    /// running nothing).
    pub fn round(
        &mut self,
        target: &Model,
        drafter: &mut dyn Drafter,
        mut on_token: impl FnMut(u32),
    ) -> Result<Option<FinishReason>> {
        if self.finish.is_some() {
            return Ok(self.finish);
        }
        let f = self.round_inner(target, drafter, &mut on_token)?;
        self.finish = f;
        Ok(f)
    }

    /// One round's steps, in the order their device work and host reads run.
    fn round_inner(
        &mut self,
        target: &Model,
        drafter: &mut dyn Drafter,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Option<FinishReason>> {
        let Some(proposed) = self.propose(target, drafter)? else { return Ok(self.finish) };
        let keep = self.own_window(&proposed);
        let window = self.keep(proposed, keep)?;
        let verified = self.verify(target, &window)?;
        self.conclude(drafter, window, &verified.logits, verified.taps.as_ref(), on_token)
    }

    /// A round's first steps: draft, and read the drafts' confidences when the request prunes
    /// (one host read). `None` when the request has reached `max_tokens` (it has then ended).
    /// The round goes on with [`Self::keep`], a verify forward over [`Window::tokens`] on
    /// [`Self::cache_mut`] (alone, or batched with other requests' windows), and
    /// [`Self::conclude`].
    pub fn propose(&mut self, target: &Model, drafter: &mut dyn Drafter) -> Result<Option<Proposed>> {
        let Some(mut p) = self.draft_lazily(target, drafter)? else { return Ok(None) };
        self.read_confidences(&mut p)?;
        Ok(Some(p))
    }

    /// [`Self::propose`] without the read: the drafts are a graph not yet evaluated, so a
    /// batch can evaluate every request's drafts at once ([`Proposed::pending`]) before
    /// [`Self::read_confidences`].
    pub fn draft_lazily(&mut self, target: &Model, drafter: &mut dyn Drafter) -> Result<Option<Proposed>> {
        let Some(d) = self.prepare(drafter, None)? else { return Ok(None) };
        self.draft(target, drafter, d).map(Some)
    }

    /// The drafts `drafter` proposes alone for a prepared round (none when it may propose none),
    /// checked ([`Self::proposed`]).
    pub fn draft(&mut self, target: &Model, drafter: &mut dyn Drafter, d: Drafting) -> Result<Proposed> {
        let p = match d.max_drafts {
            0 => None,
            _ => Some(drafter.propose(self.draft_request(target, &d))?),
        };
        self.proposed(d, p, &drafter.name())
    }

    /// Before a round's drafts: `None` when the request has reached `max_tokens` (it has then
    /// ended); else the anchor and how many drafts the round may propose (0: a plain step),
    /// at most `cap` when given (a batch schedule that found drafting does not pay this step;
    /// decided before any draft is seen, so exactness is untouched). The drafts then come from
    /// the drafter with [`Self::draft_request`] (alone, or batched with other requests'), and
    /// [`Self::proposed`] checks them.
    pub fn prepare(&mut self, drafter: &dyn Drafter, cap: Option<usize>) -> Result<Option<Drafting>> {
        if self.finish.is_some() {
            return Ok(None);
        }
        if self.tokens.len() >= self.cfg.generate.max_tokens {
            self.finish = Some(FinishReason::Length);
            return Ok(None);
        }
        self.check_aligned(drafter)?;
        let max_drafts = self.max_drafts().min(cap.unwrap_or(usize::MAX));
        Ok(Some(Drafting { anchor: Array::from_slice(&[self.pending], &[1])?, max_drafts }))
    }

    /// What the drafter is asked for this round (under sampling it draws with this request's
    /// keys).
    pub fn draft_request<'a>(&'a mut self, target: &'a Model, d: &'a Drafting) -> DraftRequest<'a> {
        let sampling = if self.greedy {
            DraftSampling::Greedy
        } else {
            DraftSampling::Sample { cfg: &self.cfg.generate.sampler, keys: &mut self.keys }
        };
        DraftRequest {
            anchor: &d.anchor,
            position: self.cache.offset(),
            max_drafts: d.max_drafts,
            sampling,
            target,
            target_cache: &self.cache,
        }
    }

    /// The round's drafts, checked against the drafter contract: 1..=`max_drafts` tokens
    /// (none when it proposed nothing), under sampling with the q rows they were drawn from.
    pub fn proposed(&self, d: Drafting, p: Option<Proposal>, drafter: &str) -> Result<Proposed> {
        if let Some(p) = &p {
            if p.is_empty()? || p.len()? > d.max_drafts {
                return Err(Error::Contract(format!(
                    "{drafter} returned {} drafts (asked for 1..={})",
                    p.len()?,
                    d.max_drafts
                )));
            }
            if !self.greedy && p.q.is_none() {
                return Err(Error::Contract(format!(
                    "{drafter} gave no draft distribution; sampled verification needs q"
                )));
            }
        }
        let offered = match &p {
            Some(p) => p.len()?,
            None => 0,
        };
        Ok(Proposed { anchor: d.anchor, proposal: p, conf: None, offered })
    }

    /// Reads the drafts' confidences when the request prunes (one host read; nothing
    /// otherwise, or when already read).
    pub fn read_confidences(&mut self, p: &mut Proposed) -> Result<()> {
        if p.conf.is_some() || self.cut.is_none() {
            return Ok(());
        }
        if let Some(c) = p.proposal.as_ref().and_then(|p| p.confidence.as_ref()) {
            self.stats.host_syncs += 1;
            p.conf = Some(c.to_f32_vec()?);
        }
        Ok(())
    }

    /// The calibrated survival of each proposed draft (the chance it and every draft before it
    /// are accepted), where the request runs the throughput schedule: what a batch schedule
    /// weighs across requests. `None` without a plan or confidences.
    pub fn survivals(&self, p: &Proposed) -> Option<Vec<f32>> {
        match (&self.cut, &p.conf) {
            (Some(Cut::Throughput(plan)), Some(c)) => Some(plan.sts.survivals_of_confidences(c)),
            _ => None,
        }
    }

    /// Whether the request runs the throughput schedule, so a batch schedule may choose its
    /// window from [`Self::survivals`] instead of [`Self::own_window`] (not a look-ahead plan,
    /// which only the statistical gate runs: it keeps its own biased window, to be caught).
    pub fn throughput_scheduled(&self) -> bool {
        matches!(&self.cut, Some(Cut::Throughput(p)) if !p.is_look_ahead())
    }

    /// Drafts per round at most (γ, or the request's `gamma`).
    pub fn gamma(&self) -> usize {
        self.gamma
    }

    /// Whether the request decodes greedily (its output then does not depend on its windows).
    pub fn is_greedy(&self) -> bool {
        self.greedy
    }

    /// The window the request's own rule keeps of `p` (its cut, or the whole block).
    pub fn own_window(&self, p: &Proposed) -> usize {
        match (&self.cut, &p.conf) {
            (Some(cut), Some(c)) => cut.kept(c, self.rate.rate()).min(p.offered),
            _ => p.offered,
        }
    }

    /// The verify window keeping the first `keep` of `p`'s drafts (at most those offered).
    pub fn keep(&mut self, p: Proposed, keep: usize) -> Result<Window> {
        let keep = keep.min(p.offered);
        if let (Some(cap), Some(_)) = (&mut self.draft_cap, &p.conf) {
            cap.record(p.offered, keep);
        }
        let round_conf = p.conf.map(|c| c[..keep].to_vec()).unwrap_or_default();
        let proposal = match p.proposal {
            Some(prop) if keep > 0 && keep < p.offered => Some(prop.truncate(keep)?),
            Some(prop) if keep > 0 => Some(prop),
            _ => None,
        };
        let tokens = match &proposal {
            Some(prop) => concatenate(&[&p.anchor, &prop.tokens], 0)?,
            None => p.anchor,
        };
        Ok(Window { tokens, proposal, drafts: keep, round_conf })
    }

    /// The target cache a window's verify forward extends.
    pub fn cache_mut(&mut self) -> &mut Cache {
        &mut self.cache
    }

    /// The layers the verify forward taps for the drafter.
    pub fn taps(&self) -> &TapSet {
        &self.taps
    }

    /// A round's last steps, given the verify forward's rows of `window` (scored on
    /// [`Self::cache_mut`]): the verdict (one host read), statistics, emit, commit and roll back.
    /// `logits` // `[d+1, V]`; `taps` // `[1, d+1, m·H]` when the drafter taps.
    pub fn conclude(
        &mut self,
        drafter: &mut dyn Drafter,
        window: Window,
        logits: &Array,
        taps: Option<&Array>,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Option<FinishReason>> {
        let d = window.drafts;
        let verdict = self.verdict(logits, window.proposal.as_ref())?;
        self.record(window.proposal.is_some(), d, &verdict, &window.round_conf);
        if let Some(f) = self.emit(&verdict, on_token) {
            self.finish = Some(f);
            return Ok(Some(f));
        }
        self.commit(drafter, taps, d, &verdict)?;
        Ok(None)
    }

    /// The invariant before each draft: the drafter's context holds exactly the tokens in the
    /// target cache.
    fn check_aligned(&self, drafter: &dyn Drafter) -> Result<()> {
        if drafter.context_len() != self.cache.offset() {
            return Err(Error::Contract(format!(
                "drafter context holds {} rows but the target cache holds {} tokens",
                drafter.context_len(),
                self.cache.offset()
            )));
        }
        Ok(())
    }

    /// Drafts this round may propose: γ, one less than the tokens left (the verify adds one),
    /// and the throughput schedule's cap.
    fn max_drafts(&self) -> usize {
        let remaining = self.cfg.generate.max_tokens - self.tokens.len();
        let cap = self.draft_cap.as_ref().map_or(self.gamma, DraftCap::limit);
        self.gamma.min(remaining - 1).min(cap)
    }

    /// Verify: one tapped forward over [pending, drafts], stepwise, so every row is scored
    /// exactly as plain decoding would score that token.
    fn verify(&mut self, target: &Model, window: &Window) -> Result<Verified> {
        let ids = window.tokens.reshape(&[1, window.drafts as i32 + 1])?;
        let taps = &self.taps;
        let out = target.forward_stepwise(&ids, &mut self.cache, (!taps.is_empty()).then_some(taps))?;
        let logits = target.logits_from_hidden(&out.hidden)?.squeeze(0)?; // [d+1, V]
        target.check_first_logits(&logits)?;
        Ok(Verified { logits, taps: out.taps })
    }

    /// Accept: the verdict on the drafts and the one recovered or bonus token (one host read).
    fn verdict(&mut self, logits: &Array, proposal: Option<&Proposal>) -> Result<Judged> {
        if self.greedy {
            greedy_verdict(logits, proposal, &self.cfg.generate.sampler, self.rule, &mut self.stats)
        } else {
            sampled_verdict(logits, proposal, &self.cfg.generate.sampler, &mut self.keys, self.rule, &mut self.stats)
        }
    }

    /// The round's statistics: the achieved rate, τ, and the confidence samples read.
    fn record(&mut self, drafted: bool, d: usize, verdict: &Judged, round_conf: &[f32]) {
        if let Some(Cut::Throughput(plan)) = &self.cut {
            self.rate.record(verdict.accepted + 1, plan.cost.get(d).copied().unwrap_or(f32::NAN));
        }
        if drafted {
            self.stats.record_round(d, verdict.accepted);
        } else {
            // A draft-free forward (the last token of a request, or a round whose schedule found
            // that no draft pays) is a plain decode step, not a speculative round: τ ignores it.
            self.stats.plain_steps += 1;
        }
        self.conf_samples.extend(round_conf.iter().enumerate().map(|(pos, &conf)| ConfSample {
            pos,
            conf,
            accepted: pos < verdict.accepted,
        }));
    }

    /// Emit: accepted drafts, then the recovered/bonus token; stops exactly where plain
    /// decoding would (a stop token is never emitted, even as an accepted draft).
    fn emit(&mut self, verdict: &Judged, on_token: &mut dyn FnMut(u32)) -> Option<FinishReason> {
        let gen = &self.cfg.generate;
        let accepted = verdict.drafts[..verdict.accepted].iter().copied();
        for t in accepted.chain([verdict.next.token()]) {
            if gen.stop_tokens.contains(&t) {
                return Some(FinishReason::Stop);
            }
            self.tokens.push(t);
            on_token(t);
            if self.tokens.len() >= gen.max_tokens {
                return Some(FinishReason::Length);
            }
        }
        None
    }

    /// Commit the anchor + accepted rows to the drafter; roll back the rejected tips of the
    /// target cache; the recovered/bonus token is the next round's anchor.
    fn commit(&mut self, drafter: &mut dyn Drafter, taps: Option<&Array>, d: usize, verdict: &Judged) -> Result<()> {
        let keep = verdict.accepted + 1;
        let rows = match taps {
            Some(t) => Some(t.slice_axis(1, 0, keep as i32)?),
            None => None,
        };
        drafter.commit(rows.as_ref(), keep)?;
        self.cache.trim(d - verdict.accepted)?;
        self.pending = verdict.next.token();
        Ok(())
    }

    /// The output so far: the emitted tokens, why the request ended (`Length` if it was stopped
    /// early by the caller) and the statistics.
    pub fn finish(mut self) -> SpecOutput {
        let finish = self.finish.unwrap_or(FinishReason::Length);
        self.stats.emitted = self.tokens.len();
        self.stats.stops = usize::from(finish == FinishReason::Stop);
        self.stats.decode_ms = self.t1.elapsed().as_secs_f64() * 1e3;
        SpecOutput { tokens: self.tokens, finish, stats: self.stats, conf_samples: self.conf_samples }
    }
}
