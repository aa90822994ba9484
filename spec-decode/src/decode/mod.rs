//! The speculative decode loop: draft → verify (one tapped target forward over the pending token
//! plus the drafts) → accept → emit → commit the anchor and accepted rows to the drafter's
//! context → roll back the rejected tips in every target cache → repeat.
//!
//! The verify forward is *stepwise* (`Model::forward_stepwise`): its rows are bit-identical to
//! the logits plain decoding computes one token at a time, so greedy output equals plain greedy
//! output token for token, and sampling draws from exactly plain decoding's distributions.
//!
//! Prefill is tail-split (`prefill`): all prompt tokens but the last are run through the target
//! (tapped) and seed the drafter's context; the last prompt token is *pending* and heads the
//! first verify window, so every emitted token comes out of a verify. Invariant before each
//! draft: the drafter's context length == the target cache offset == the pending token's
//! position. The rounds are stepped one at a time by [`SpecRounds`] (`rounds`); this module
//! holds a request's settings and output and runs the stepper to the end.
//!
//! Host synchronisation: the drafts stay on the device and feed the verify directly; the verdict
//! inputs (drafts, target picks, and under sampling the acceptance flags, residual draws and the
//! bonus draw for every position) are computed on the device and read back in ONE transfer per
//! round. Confidence pruning and the throughput schedule add one read before the verify (the
//! confidences decide the window).

use gemma4::generate::GenerateConfig;
use gemma4::Model;
use mlx_core::Array;

use crate::calibration::ConfSample;
use crate::drafter::Drafter;
use crate::error::{Error, Result};
use crate::schedule::Pruning;
use crate::stats::SpecStats;
use crate::verify::rule::VerifyRule;

mod prefill;
mod rounds;

pub use prefill::{prefill, prefill_from, Prefilled, PrefixState};
pub use rounds::{Drafting, Proposed, SpecRounds, Window};

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
    /// Emitted token ids, without the prompt or the stop token.
    pub tokens: Vec<u32>,
    /// Why the request ended.
    pub finish: FinishReason,
    /// Rounds, acceptance and timing.
    pub stats: SpecStats,
    /// Confidence per verified draft position and whether it was accepted; filled only when
    /// pruning is active (that is when confidences are read). `Pruning::Thresholds(vec![])`
    /// reads them without pruning, for calibration.
    pub conf_samples: Vec<ConfSample>,
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
