//! The speculative decode loop: draft → verify (one tapped target forward over the pending token
//! plus the drafts) → accept → emit → commit the anchor and accepted rows to the drafter's
//! context → roll back the rejected tips in every target cache → repeat.
//!
//! The verify forward is *stepwise* (`Model::forward_stepwise`): its rows are bit-identical to
//! the logits plain decoding computes one token at a time, so greedy output equals plain greedy
//! output token for token, and sampling draws from exactly plain decoding's distributions.
//!
//! Prefill is tail-split: all prompt tokens but the last are run through the target (tapped) and
//! seed the drafter's context; the last prompt token is *pending* and heads the first verify
//! window, so every emitted token comes out of a verify. Invariant before each draft: the
//! drafter's context length == the target cache offset == the pending token's position.
//!
//! Host synchronisation: the drafts stay on the device and feed the verify directly; the verdict
//! inputs (drafts, target picks, and under sampling the acceptance flags, residual draws and the
//! bonus draw for every position) are computed on the device and read back in ONE transfer per
//! round. Confidence pruning and the throughput schedule add one read before the verify (the
//! confidences decide the window).

use std::time::Instant;

use gemma4::generate::GenerateConfig;
use gemma4::{Cache, Model, TapSet};
use mlx_core::random::KeyChain;
use mlx_core::{concatenate, Array};

use crate::calibration::ConfSample;
use crate::drafter::{DraftRequest, DraftSampling, Drafter};
use crate::error::{Error, Result};
use crate::schedule::draft_cap::DraftCap;
use crate::schedule::request_rate::RequestRate;
use crate::schedule::{Cut, Pruning};
use crate::stats::SpecStats;
use crate::verify::rule::VerifyRule;
use crate::verify::{greedy_verdict, sampled_verdict};

pub use gemma4::generate::FinishReason;

/// Settings of one speculative request: the request as plain decoding would run it, plus how
/// many drafts a round verifies and whether low-confidence drafts are pruned.
///
/// ```
/// use spec_decode::{Pruning, SpecConfig};
/// let cfg = SpecConfig { gamma: Some(4), pruning: Pruning::MinConf(0.3), ..SpecConfig::default() };
/// assert_eq!(cfg.generate.max_tokens, 256);
/// ```
#[derive(Clone, Debug, Default)]
pub struct SpecConfig {
    /// Max tokens, sampler, seed, stop tokens and prefill chunk, exactly as plain decoding
    /// takes them; speculative output has plain decoding's law under these settings.
    pub generate: GenerateConfig,
    /// Drafts per round, 1..=the drafter's block size γ; `None` uses the drafter's γ.
    pub gamma: Option<usize>,
    /// Confidence pruning of each block (off by default).
    pub pruning: Pruning,
}

impl SpecConfig {
    /// The drafts per round for `drafter`, checked against its block size.
    pub fn gamma_for(&self, drafter: &dyn Drafter) -> Result<usize> {
        let g = self.gamma.unwrap_or_else(|| drafter.gamma());
        if g < 1 {
            return Err(Error::Settings { field: "gamma", detail: "gamma must be >= 1".into() });
        }
        if g > drafter.gamma() {
            return Err(Error::Settings {
                field: "gamma",
                detail: format!("gamma {g} exceeds the drafter's block size {}", drafter.gamma()),
            });
        }
        Ok(g)
    }
}

/// Output of a speculative request.
#[derive(Clone, Debug)]
pub struct SpecOutput {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: SpecStats,
    /// Confidence per verified draft position and whether it was accepted; filled only when
    /// pruning is active (that is when confidences are read). `Pruning::Thresholds(vec![])`
    /// reads them without pruning, for calibration.
    pub conf_samples: Vec<ConfSample>,
}

/// The state after the tail-split prefill: the target cache holds every prompt token but the
/// last, whose tapped rows seed the drafter; the last prompt token is pending. Reusable: every
/// decode from it starts from a copy of the cache (arrays are shared, so copies are free).
#[derive(Clone, Debug)]
pub struct Prefilled {
    cache: Cache,
    /// Tapped rows of the committed prompt tokens, the last `taps.window()` of them when the
    /// taps have a window // `[1, min(L−1, window), m·H]`
    pub(crate) ctx: Option<Array>,
    taps: TapSet,
    pending: u32,
    committed: usize,
    prompt_tokens: usize,
    forwards: usize,
    ms: f64,
}

impl Prefilled {
    /// Tokens in the target cache.
    pub fn committed(&self) -> usize {
        self.committed
    }

    /// The target cache after the prompt's head (every token but the last).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The last prompt token, not yet run through the target.
    pub fn pending(&self) -> u32 {
        self.pending
    }

    /// Tokens in the prompt.
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Hands over the tapped rows of the committed prompt tokens (to seed a drafter once): all
    /// of them, or the last `window` when the taps have one.
    pub fn take_ctx(&mut self) -> Option<Array> {
        self.ctx.take()
    }

    /// Milliseconds the prefill took.
    pub fn ms(&self) -> f64 {
        self.ms
    }
}

/// The target cache and the tapped rows after the first tokens of a prompt, prefilled in chunks
/// on the grid of `step` (chunk boundaries at multiples of `step`). A later prompt that starts
/// with the same tokens can resume from it ([`prefill_from`]); the result is then bit-identical
/// to prefilling that prompt from scratch, because the resumed computation is the very same
/// sequence of chunk forwards (see [`prefill_from`] for the rule that guarantees it).
#[derive(Clone, Debug)]
pub struct PrefixState {
    tokens: Vec<u32>,
    cache: Cache,
    /// Tapped rows per tapped chunk // each `[1, chunk, m·H]`
    rows: Vec<Array>,
    /// The committed row `rows` start at (the state's length when no chunk was tapped).
    rows_start: usize,
    taps: TapSet,
    step: usize,
    forwards: usize,
}

impl PrefixState {
    /// The prompt tokens this state has run through the target.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether [`prefill_from`] may resume from this state for `prompt` (tapped with `taps`, in
    /// chunks of `step`): the state's tokens start `prompt`'s head (all tokens but the last),
    /// and it ends on a chunk boundary of the same grid or covers the whole head; and it holds
    /// the tapped rows `prompt` needs from before its end (with a tap window, a state made for
    /// a longer prompt may have left them untapped).
    pub fn resumable_for(&self, taps: &TapSet, prompt: &[u32], step: usize) -> bool {
        let head = prompt.len().saturating_sub(1);
        let n = self.tokens.len();
        let needed = taps.first_needed_row(head);
        self.taps == *taps
            && self.step == step.max(1)
            && n <= head
            && prompt[..n] == self.tokens[..]
            && (n.is_multiple_of(self.step) || n == head)
            && (taps.is_empty() || needed >= n || self.rows_start <= needed)
    }
}

/// Runs all but the last prompt token through the target (tapped with `taps`, in chunks of
/// `step`), evaluating the cache after each chunk.
pub fn prefill(target: &Model, taps: &TapSet, prompt: &[u32], step: usize) -> Result<Prefilled> {
    prefill_from(target, taps, prompt, step, None, |_| {})
}

/// [`prefill`] resuming from `from` (the state after a prefix of the prompt), calling
/// `snapshot` with the state after every chunk (a prompt cache keeps them).
///
/// Exactness rule: `from` must end on a chunk boundary of the same grid (its length a multiple
/// of `step`) or cover the prompt's whole head. A from-scratch prefill passes through exactly
/// that state and then runs exactly the chunks that remain, so the result has the same bits.
/// Resuming anywhere else would split a chunk in two, and a chunked forward is not guaranteed
/// to give the bits of the whole one (the sliding-window ring is written in another order and
/// the attention sums over the keys in other groupings); such a `from` is refused.
pub fn prefill_from(
    target: &Model,
    taps: &TapSet,
    prompt: &[u32],
    step: usize,
    from: Option<&PrefixState>,
    mut snapshot: impl FnMut(PrefixState),
) -> Result<Prefilled> {
    let vocab = target.config().vocab_size;
    let step = step.max(1);
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::Settings { field: "prompt", detail: "the prompt is empty".into() });
    };
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Settings {
            field: "prompt",
            detail: format!("token id {bad} is outside the vocabulary of {vocab}"),
        });
    }
    let t0 = Instant::now();
    // With a tap window, chunks that end before the first needed row run untapped, and the
    // chunk holding it taps (and runs the KV-shared layers for) the rows from it on.
    let needed = taps.first_needed_row(head.len());
    let (mut cache, mut rows, mut rows_start, mut forwards, start) = match from {
        None => (target.new_cache(), Vec::new(), None, 0, 0),
        Some(f) if f.resumable_for(taps, prompt, step) => {
            let start = (!f.rows.is_empty()).then_some(f.rows_start);
            (f.cache.clone(), f.rows.clone(), start, f.forwards, f.tokens.len())
        }
        Some(_) => {
            return Err(Error::Contract(
                "a prefix state can only be resumed on a chunk boundary of the same grid and taps".into(),
            ))
        }
    };
    let mut done = start;
    for chunk in head[start..].chunks(step) {
        let ids = gemma4::generate::ids_array(chunk)?;
        if taps.is_empty() || done + chunk.len() <= needed {
            target.forward(&ids, Some(&mut cache))?;
        } else if let Some(t) =
            target.forward_tapped_from(&ids, Some(&mut cache), taps, needed.saturating_sub(done))?.taps
        {
            // The chunk's rows from the first needed one on // [1, ≤ chunk, m·H]
            mlx_core::eval(&[&t])?;
            rows.push(t);
            rows_start.get_or_insert(done.max(needed));
        }
        cache.eval()?;
        forwards += 1;
        done += chunk.len();
        snapshot(PrefixState {
            tokens: head[..done].to_vec(),
            cache: cache.clone(),
            rows: rows.clone(),
            rows_start: rows_start.unwrap_or(done),
            taps: taps.clone(),
            step,
            forwards,
        });
    }
    let ctx = if rows.is_empty() {
        // A one-token prompt commits nothing: an empty context of the right width.
        (!taps.is_empty())
            .then(|| {
                let width = (taps.points().len() * target.config().hidden_size) as i32;
                Array::zeros(&[1, 0, width], target.dtype())
            })
            .transpose()?
    } else {
        // The rows from the first needed one: all, or the window's.
        let all = concatenate(&rows, 1)?; // [1, head − rows_start, m·H]
        let skip = needed.saturating_sub(rows_start.unwrap_or(0)) as i32;
        Some(if skip > 0 { all.slice_axis(1, skip, all.dim(1)?)? } else { all })
    };
    Ok(Prefilled {
        cache,
        ctx,
        taps: taps.clone(),
        pending: last,
        committed: head.len(),
        prompt_tokens: prompt.len(),
        forwards,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Speculative decoding of `prompt`; `on_token` sees each emitted token in order.
///
/// ```no_run
/// # use std::path::Path;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let target = gemma4::Model::load(Path::new("gemma-4-e2b-it"))?;
/// let mut drafter = spec_decode::load_drafter(Path::new("gemma-4-e2b-it-dspark"), target.config())?;
/// let cfg = spec_decode::SpecConfig::default();
/// let out = spec_decode::speculative_generate(&target, drafter.as_mut(), &[2, 651], &cfg, |t| print!("{t} "))?;
/// assert_eq!(out.tokens.len(), out.stats.emitted);
/// # Ok(())
/// # }
/// ```
pub fn speculative_generate(
    target: &Model,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    cfg: &SpecConfig,
    on_token: impl FnMut(u32),
) -> Result<SpecOutput> {
    gemma4::generate::check_positions(target, prompt.len(), cfg.generate.max_tokens)?;
    let mut pre = prefill(target, &drafter.taps(), prompt, cfg.generate.prefill_step)?;
    // The prompt's tapped rows are needed only to seed the drafter: hand them over so they are
    // freed once projected, instead of living (m·H per prompt token) for the whole decode.
    let ctx = pre.ctx.take();
    decode_with_rule(target, drafter, &pre, ctx, cfg, VerifyRule::Exact, on_token)
}

/// Speculative decoding from a prefilled prompt (which must have been tapped for this drafter).
pub fn decode_from(
    target: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    cfg: &SpecConfig,
    on_token: impl FnMut(u32),
) -> Result<SpecOutput> {
    decode_with_rule(target, drafter, pre, pre.ctx.clone(), cfg, VerifyRule::Exact, on_token)
}

/// The loop; `ctx` is the prefill's tapped rows, dropped once the drafter has projected them.
pub(crate) fn decode_with_rule(
    target: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    ctx: Option<Array>,
    cfg: &SpecConfig,
    rule: VerifyRule,
    mut on_token: impl FnMut(u32),
) -> Result<SpecOutput> {
    let mut rounds = SpecRounds::start_with_rule(target, drafter, pre, ctx, cfg, rule)?;
    while rounds.round(target, drafter, &mut on_token)?.is_none() {}
    Ok(rounds.finish())
}

/// One speculative request as a value that advances one round at a time, so a caller (a
/// server's engine) can interleave requests, cancel between rounds and stream what each round
/// emits. It holds only per-request state (target cache, sampler keys, emitted tokens, stats);
/// the target and the drafter are passed to every [`SpecRounds::round`], so several requests
/// can share one target. The drafter passed must be the one [`SpecRounds::start`] reset, with
/// no other request's rounds in between.
///
/// [`speculative_generate`] and [`decode_from`] are this stepper run to the end, so stepping
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

    fn round_inner(
        &mut self,
        target: &Model,
        drafter: &mut dyn Drafter,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Option<FinishReason>> {
        let gen = &self.cfg.generate;
        let (gamma, greedy, rule) = (self.gamma, self.greedy, self.rule);
        let (stats, keys, cache, tokens) = (&mut self.stats, &mut self.keys, &mut self.cache, &mut self.tokens);
        if tokens.len() >= gen.max_tokens {
            return Ok(Some(FinishReason::Length));
        }
        if drafter.context_len() != cache.offset() {
            return Err(Error::Contract(format!(
                "drafter context holds {} rows but the target cache holds {} tokens",
                drafter.context_len(),
                cache.offset()
            )));
        }
        let remaining = gen.max_tokens - tokens.len();
        let cap = self.draft_cap.as_ref().map_or(gamma, DraftCap::limit);
        let max_drafts = gamma.min(remaining - 1).min(cap);
        let anchor = Array::from_slice(&[self.pending], &[1])?;

        // Draft.
        let mut round_conf: Vec<f32> = Vec::new();
        let proposal = if max_drafts == 0 {
            None
        } else {
            let sampling =
                if greedy { DraftSampling::Greedy } else { DraftSampling::Sample { cfg: &gen.sampler, keys } };
            let req = DraftRequest {
                anchor: &anchor,
                position: cache.offset(),
                max_drafts,
                sampling,
                target,
                target_cache: cache,
            };
            let mut p = drafter.propose(req)?;
            if p.is_empty()? || p.len()? > max_drafts {
                return Err(Error::Contract(format!(
                    "{} returned {} drafts (asked for 1..={max_drafts})",
                    drafter.name(),
                    p.len()?
                )));
            }
            if !greedy && p.q.is_none() {
                return Err(Error::Contract(format!(
                    "{} gave no draft distribution; sampled verification needs q",
                    drafter.name()
                )));
            }
            let offered = p.len()?;
            let mut keep = offered;
            if let (Some(cut), Some(conf)) = (&self.cut, &p.confidence) {
                let c = conf.to_f32_vec()?;
                stats.host_syncs += 1;
                keep = cut.kept(&c, self.rate.rate()).min(keep);
                if let Some(cap) = &mut self.draft_cap {
                    cap.record(offered, keep);
                }
                if keep > 0 && keep < p.len()? {
                    p = p.truncate(keep)?;
                }
                round_conf = c[..keep].to_vec();
            }
            // The throughput schedule may find that no draft pays: a plain step.
            (keep > 0).then_some(p)
        };
        let d = match &proposal {
            Some(p) => p.len()?,
            None => 0,
        };

        // Verify: one tapped forward over [pending, drafts].
        let window = match &proposal {
            Some(p) => concatenate(&[&anchor, &p.tokens], 0)?,
            None => anchor.clone(),
        }
        .reshape(&[1, d as i32 + 1])?;
        // Stepwise: every row is scored exactly as plain decoding would score that token.
        let taps = &self.taps;
        let out = target.forward_stepwise(&window, cache, (!taps.is_empty()).then_some(taps))?;
        let logits = target.logits_from_hidden(&out.hidden)?.squeeze(0)?; // [d+1, V]
        target.check_first_logits(&logits)?;

        let verdict = if greedy {
            greedy_verdict(&logits, proposal.as_ref(), rule, stats)?
        } else {
            sampled_verdict(&logits, proposal.as_ref(), &gen.sampler, keys, rule, stats)?
        };

        // Emit: accepted drafts, then the recovered/bonus token; stop exactly where plain
        // decoding would (a stop token is never emitted, even as an accepted draft).
        let mut emit = |t: u32, tokens: &mut Vec<u32>| -> Option<FinishReason> {
            if gen.stop_tokens.contains(&t) {
                return Some(FinishReason::Stop);
            }
            tokens.push(t);
            on_token(t);
            (tokens.len() >= gen.max_tokens).then_some(FinishReason::Length)
        };
        if let Some(Cut::Throughput(plan)) = &self.cut {
            self.rate.record(verdict.accepted + 1, plan.cost.get(d).copied().unwrap_or(f32::NAN));
        }
        if proposal.is_some() {
            stats.record_round(d, verdict.accepted);
        } else {
            // A draft-free forward (the last token of a request, or a round whose schedule found
            // that no draft pays) is a plain decode step, not a speculative round: τ ignores it.
            stats.plain_steps += 1;
        }
        self.conf_samples.extend(round_conf.iter().enumerate().map(|(pos, &conf)| ConfSample {
            pos,
            conf,
            accepted: pos < verdict.accepted,
        }));
        for &t in &verdict.drafts[..verdict.accepted] {
            if let Some(f) = emit(t, tokens) {
                return Ok(Some(f));
            }
        }
        let next = verdict.next.token();
        if let Some(f) = emit(next, tokens) {
            return Ok(Some(f));
        }

        // Commit the anchor + accepted rows; roll back the rejected tips.
        let keep = verdict.accepted + 1;
        let rows = match &out.taps {
            Some(t) => Some(t.slice_axis(1, 0, keep as i32)?),
            None => None,
        };
        drafter.commit(rows.as_ref(), keep)?;
        cache.trim(d - verdict.accepted)?;
        self.pending = next;
        Ok(None)
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
