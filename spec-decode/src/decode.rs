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
//! round. Confidence pruning adds one read before the verify (its length decides the window).

use std::time::Instant;

use gemma4::generate::GenerateConfig;
use gemma4::{Cache, Model, TapSet};
use mlx_core::random::KeyChain;
use mlx_core::{concatenate, Array};

use crate::calibration::ConfSample;
use crate::drafter::{DraftRequest, DraftSampling, Drafter};
use crate::error::{Error, Result};
use crate::rule::VerifyRule;
use crate::schedule::{kept_len, Pruning};
use crate::stats::SpecStats;
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
    /// Tapped rows of the committed prompt tokens // `[1, L−1, m·H]`
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
}

/// Runs all but the last prompt token through the target (tapped with `taps`, in chunks of
/// `step`), evaluating the cache after each chunk.
pub fn prefill(target: &Model, taps: &TapSet, prompt: &[u32], step: usize) -> Result<Prefilled> {
    let vocab = target.config().vocab_size;
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
    let mut cache = target.new_cache();
    let mut rows = Vec::new();
    let mut forwards = 0;
    for chunk in head.chunks(step.max(1)) {
        let ids = gemma4::generate::ids_array(chunk)?;
        if taps.is_empty() {
            target.forward(&ids, Some(&mut cache))?;
        } else if let Some(t) = target.forward_tapped(&ids, Some(&mut cache), taps)?.taps {
            mlx_core::eval(&[&t])?;
            rows.push(t);
        }
        cache.eval()?;
        forwards += 1;
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
        Some(concatenate(&rows, 1)?)
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
    let vocab = target.config().vocab_size;
    let gamma = cfg.gamma_for(drafter)?;
    let gen = &cfg.generate;
    gen.sampler.validate(vocab)?;
    if cfg.pruning.is_active() && !drafter.has_confidence() {
        return Err(Error::Settings {
            field: "pruning",
            detail: format!("{} has no confidence head, so its drafts cannot be pruned by confidence", drafter.name()),
        });
    }
    let thresholds = cfg.pruning.resolve(drafter.thresholds(), gamma)?;
    let taps = drafter.taps();
    if taps != pre.taps {
        return Err(Error::Contract("the prefill was tapped for a different drafter".into()));
    }
    let greedy = gen.sampler.is_greedy();
    let mut stats = SpecStats {
        prompt_tokens: pre.prompt_tokens,
        prefill_forwards: pre.forwards,
        prefill_ms: pre.ms,
        ..Default::default()
    };
    let mut keys = KeyChain::new(gen.seed)?;
    let mut cache = pre.cache.clone();
    let t1 = Instant::now();
    drafter.reset(ctx.as_ref(), pre.committed)?;
    drop(ctx);

    let mut conf_samples = Vec::new();
    let mut pending = pre.pending;
    let mut tokens = Vec::new();
    let finish = 'rounds: loop {
        if tokens.len() >= gen.max_tokens {
            break FinishReason::Length;
        }
        if drafter.context_len() != cache.offset() {
            return Err(Error::Contract(format!(
                "drafter context holds {} rows but the target cache holds {} tokens",
                drafter.context_len(),
                cache.offset()
            )));
        }
        let remaining = gen.max_tokens - tokens.len();
        let max_drafts = gamma.min(remaining - 1);
        let anchor = Array::from_slice(&[pending], &[1])?;

        // Draft.
        let mut round_conf: Vec<f32> = Vec::new();
        let proposal = if max_drafts == 0 {
            None
        } else {
            let sampling = if greedy {
                DraftSampling::Greedy
            } else {
                DraftSampling::Sample { cfg: &gen.sampler, keys: &mut keys }
            };
            let req = DraftRequest {
                anchor: &anchor,
                position: cache.offset(),
                max_drafts,
                sampling,
                target,
                target_cache: &cache,
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
            if let (Some(th), Some(conf)) = (&thresholds, &p.confidence) {
                let c = conf.to_f32_vec()?;
                stats.host_syncs += 1;
                let keep = kept_len(&c, th);
                if keep < p.len()? {
                    p = p.truncate(keep)?;
                }
                round_conf = c[..keep].to_vec();
            }
            Some(p)
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
        let out = target.forward_stepwise(&window, &mut cache, (!taps.is_empty()).then_some(&taps))?;
        let logits = target.logits_from_hidden(&out.hidden)?.squeeze(0)?; // [d+1, V]

        let verdict = if greedy {
            greedy_verdict(&logits, proposal.as_ref(), rule, &mut stats)?
        } else {
            sampled_verdict(&logits, proposal.as_ref(), &gen.sampler, &mut keys, rule, &mut stats)?
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
        if proposal.is_some() {
            stats.record_round(d, verdict.accepted);
        } else {
            // The last token of a request can only come from a draft-free forward: it is a
            // plain decode step, not a speculative round, so τ does not count it.
            stats.plain_steps += 1;
        }
        conf_samples.extend(round_conf.iter().enumerate().map(|(pos, &conf)| ConfSample {
            pos,
            conf,
            accepted: pos < verdict.accepted,
        }));
        for &t in &verdict.drafts[..verdict.accepted] {
            if let Some(f) = emit(t, &mut tokens) {
                break 'rounds f;
            }
        }
        let next = verdict.next.token();
        if let Some(f) = emit(next, &mut tokens) {
            break 'rounds f;
        }

        // Commit the anchor + accepted rows; roll back the rejected tips.
        let keep = verdict.accepted + 1;
        let rows = match &out.taps {
            Some(t) => Some(t.slice_axis(1, 0, keep as i32)?),
            None => None,
        };
        drafter.commit(rows.as_ref(), keep)?;
        cache.trim(d - verdict.accepted)?;
        pending = next;
    };
    stats.emitted = tokens.len();
    stats.stops = usize::from(finish == FinishReason::Stop);
    stats.decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    Ok(SpecOutput { tokens, finish, stats, conf_samples })
}
