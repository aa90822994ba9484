//! Verification of one round on the device: the greedy verdict (longest prefix of drafts equal
//! to the target's picks) and speculative sampling, whose pieces (`accept_flags`,
//! `residual_weights`, `probs::sample_rows`) are public so the property tests check the very
//! ops the loop runs against the host reference in `accept`.

use gemma4::sampling::{biased_logprobs, SamplerConfig};
use mlx_core::random::{self, KeyChain};
use mlx_core::{concatenate, where_, Array, Dtype};

use crate::drafter::Proposal;
use crate::error::{Error, Result};
use crate::stats::SpecStats;
use crate::verify::accept::{first_rejection_or_bonus, NextToken, RESIDUAL_MASS_EPSILON};
use crate::verify::probs::{probabilities, sample_residual_rows, sample_rows};
use crate::verify::rule::VerifyRule;

/// A verdict plus the host copy of the drafts it judged.
pub(crate) struct Judged {
    pub accepted: usize,
    pub next: NextToken,
    pub drafts: Vec<u32>,
}

/// Greedy verification: drafts and the target's picks (argmax of the logprobs with the
/// request's `logit_bias`, plain greedy's rule) come back in one read; the verdict is the
/// longest matching prefix, then the pick after it. `logits` // `[d+1, V]`
pub(crate) fn greedy_verdict(
    logits: &Array,
    proposal: Option<&Proposal>,
    sampler: &SamplerConfig,
    rule: VerifyRule,
    stats: &mut SpecStats,
) -> Result<Judged> {
    let picks = biased_logprobs(logits, sampler)?.argmax(-1, false)?.astype(Dtype::U32)?; // [d+1]
    let d = match proposal {
        Some(p) => p.len()?,
        None => 0,
    };
    let both = match proposal {
        Some(p) => concatenate(&[&p.tokens, &picks], 0)?,
        None => picks,
    };
    let host = both.to_vec::<u32>()?;
    stats.host_syncs += 1;
    let (drafts, picks) = host.split_at(d);
    let flags: Vec<bool> = match rule {
        VerifyRule::Exact => drafts.iter().zip(picks).map(|(x, t)| x == t).collect(),
        VerifyRule::AcceptAll => vec![true; d],
    };
    let v = first_rejection_or_bonus(&flags, &picks[..d], picks[d])?;
    Ok(Judged { accepted: v.accepted, next: v.next, drafts: drafts.to_vec() })
}

/// Per draft, whether it is accepted given one uniform `u` in [0, 1): `u·q(x) < p(x)`, which
/// holds with probability min(1, p(x)/q(x)). All `[d]` f32 (flags: bool).
pub fn accept_flags(u: &Array, px: &Array, qx: &Array) -> Result<Array> {
    Ok(u.multiply(qx)?.less(px)?)
}

/// Weights of each row's residual max(p − q, 0) (unnormalised), or p itself where that mass is
/// (numerically) zero, i.e. where p ≤ q everywhere and a rejection cannot happen.
/// `p`, `q` // `[d, V]` f32 probabilities -> `[d, V]` f32, for [`crate::verify::probs::sample_rows`]
pub fn residual_weights(p: &Array, q: &Array) -> Result<Array> {
    let res = p.subtract(q)?.maximum_scalar(0.0)?;
    let empty = res.sum(&[-1], true)?.less_equal_scalar(RESIDUAL_MASS_EPSILON)?;
    Ok(where_(&empty, p, &res)?)
}

/// Speculative sampling with every random draw made on the device: per position k the accept
/// flag and a residual draw, plus the bonus draw from p_d, read back in one transfer. Draws
/// are inverse-CDF draws ([`sample_rows`]): no logarithm over the vocabulary. The host
/// takes the first rejected position's residual draw, or the bonus if none was rejected.
/// `logits` // `[d+1, V]`
pub(crate) fn sampled_verdict(
    logits: &Array,
    proposal: Option<&Proposal>,
    sampler: &SamplerConfig,
    keys: &mut KeyChain,
    rule: VerifyRule,
    stats: &mut SpecStats,
) -> Result<Judged> {
    // p with the request's logit bias: acceptance, residual and bonus all draw on it.
    let p = probabilities(logits, sampler)?; // [d+1, V] f32
    let d = match proposal {
        Some(p) => p.len()? as i32,
        None => 0,
    };
    // Every uniform of the round from one key: d accept tests, d residual draws, the bonus.
    let u = random::uniform(0.0, 1.0, &[2 * d + 1], Dtype::F32, &keys.next_key()?)?; // [2d+1]
    let p_bonus = p.slice_axis(0, d, d + 1)?;
    let bonus = sample_rows(&p_bonus, &u.slice_axis(0, 2 * d, 2 * d + 1)?)?; // [1]
    let Some(prop) = proposal else {
        let host = bonus.to_vec::<u32>()?;
        stats.host_syncs += 1;
        return Ok(Judged { accepted: 0, next: NextToken::Bonus(host[0]), drafts: vec![] });
    };
    // q exactly as the drafts were drawn from it (never recomputed here).
    let q = prop.q.as_ref().ok_or_else(|| Error::Contract("no draft distribution q".into()))?; // [d, V] f32
    let pk = p.slice_axis(0, 0, d)?;
    let idx = prop.tokens.reshape(&[d, 1])?;
    let px = pk.take_along_axis(&idx, -1)?.reshape(&[d])?;
    let qx = q.take_along_axis(&idx, -1)?.reshape(&[d])?;
    let accept = accept_flags(&u.slice_axis(0, 0, d)?, &px, &qx)?; // [d] bool
    let recovered = sample_residual_rows(&pk, q, &u.slice_axis(0, d, 2 * d)?)?; // [d]
    let packed = concatenate(&[&prop.tokens, &accept.astype(Dtype::U32)?, &recovered, &bonus], 0)?;
    let host = packed.to_vec::<u32>()?;
    stats.host_syncs += 1;
    let d = d as usize;
    let drafts = host[..d].to_vec();
    let flags: Vec<bool> = match rule {
        VerifyRule::Exact => host[d..2 * d].iter().map(|&f| f != 0).collect(),
        VerifyRule::AcceptAll => vec![true; d],
    };
    let v = first_rejection_or_bonus(&flags, &host[2 * d..3 * d], host[3 * d])?;
    Ok(Judged { accepted: v.accepted, next: v.next, drafts })
}
