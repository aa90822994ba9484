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
        if self.tokens.len() >= self.cfg.generate.max_tokens {
            return Ok(Some(FinishReason::Length));
        }
        self.check_aligned(drafter)?;
        let max_drafts = self.max_drafts();
        let anchor = Array::from_slice(&[self.pending], &[1])?;
        let (proposal, round_conf) = match max_drafts {
            0 => (None, Vec::new()),
            n => {
                let p = self.draft(target, drafter, &anchor, n)?;
                self.prune(p)?
            }
        };
        let d = match &proposal {
            Some(p) => p.len()?,
            None => 0,
        };
        let verified = self.verify(target, &anchor, proposal.as_ref(), d)?;
        let verdict = self.verdict(&verified.logits, proposal.as_ref())?;
        self.record(proposal.is_some(), d, &verdict, &round_conf);
        if let Some(f) = self.emit(&verdict, on_token) {
            return Ok(Some(f));
        }
        self.commit(drafter, verified.taps.as_ref(), d, &verdict)?;
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

    /// Draft: 1..=`max_drafts` tokens after the anchor, on the device, checked against the
    /// drafter contract (under sampling with the q rows they were drawn from).
    fn draft(
        &mut self,
        target: &Model,
        drafter: &mut dyn Drafter,
        anchor: &Array,
        max_drafts: usize,
    ) -> Result<Proposal> {
        let sampling = if self.greedy {
            DraftSampling::Greedy
        } else {
            DraftSampling::Sample { cfg: &self.cfg.generate.sampler, keys: &mut self.keys }
        };
        let req = DraftRequest {
            anchor,
            position: self.cache.offset(),
            max_drafts,
            sampling,
            target,
            target_cache: &mut self.cache,
        };
        let p = drafter.propose(req)?;
        if p.is_empty()? || p.len()? > max_drafts {
            return Err(Error::Contract(format!(
                "{} returned {} drafts (asked for 1..={max_drafts})",
                drafter.name(),
                p.len()?
            )));
        }
        if !self.greedy && p.q.is_none() {
            return Err(Error::Contract(format!(
                "{} gave no draft distribution; sampled verification needs q",
                drafter.name()
            )));
        }
        Ok(p)
    }

    /// Prune: under a cut rule the confidences are read (one host read) and the block is
    /// truncated; returns the drafts to verify (none: the schedule found that no draft pays,
    /// a plain step) and the confidences read of the kept ones.
    fn prune(&mut self, mut p: Proposal) -> Result<(Option<Proposal>, Vec<f32>)> {
        let offered = p.len()?;
        let mut keep = offered;
        let mut round_conf = Vec::new();
        if let (Some(cut), Some(conf)) = (&self.cut, &p.confidence) {
            let c = conf.to_f32_vec()?;
            self.stats.host_syncs += 1;
            keep = cut.kept(&c, self.rate.rate()).min(keep);
            if let Some(cap) = &mut self.draft_cap {
                cap.record(offered, keep);
            }
            if keep > 0 && keep < p.len()? {
                p = p.truncate(keep)?;
            }
            round_conf = c[..keep].to_vec();
        }
        Ok(((keep > 0).then_some(p), round_conf))
    }

    /// Verify: one tapped forward over [pending, drafts], stepwise, so every row is scored
    /// exactly as plain decoding would score that token.
    fn verify(&mut self, target: &Model, anchor: &Array, proposal: Option<&Proposal>, d: usize) -> Result<Verified> {
        let window = match proposal {
            Some(p) => concatenate(&[anchor, &p.tokens], 0)?,
            None => anchor.clone(),
        }
        .reshape(&[1, d as i32 + 1])?;
        let taps = &self.taps;
        let out = target.forward_stepwise(&window, &mut self.cache, (!taps.is_empty()).then_some(taps))?;
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
