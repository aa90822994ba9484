//! Acceptance rules: given the proposer's drafts and the scorer's target rows, decide how many
//! drafts survive and which single token the verifier adds. Pure Rust over host `u32` ids and
//! `f32` probability rows; no MLX, so every rule here is property-tested on any host.
//!
//! Vocabulary (vLLM's rejection sampler, used verbatim across this crate):
//!
//! - **drafts** `x_0..x_{d-1}`: the proposer's tokens for the positions after the *anchor* (the
//!   last committed token). The scorer runs the target once over `[anchor, x_0, .., x_{d-1}]` and
//!   returns `d + 1` rows; row `i` is the target's prediction for the token after window
//!   position `i`, so row `i` judges draft `x_i` and row `d` predicts the token after the last draft.
//! - **accepted**: the length of the draft prefix the verifier keeps (`0..=d`). Accepted drafts
//!   are emitted as they are.
//! - **recovered**: when draft `x_k` is rejected (`accepted == k < d`), the verifier emits one
//!   replacement token drawn from row `k`. Under greedy verification it is the target argmax
//!   (a "correction"). Under speculative sampling it is drawn from the *residual*
//!   `normalize(max(p_k − q_k, 0))`. Drafts after `x_k` are discarded.
//! - **bonus**: when every draft is accepted (`accepted == d`), the verifier draws one extra
//!   token from the last target row `d`. The draft model never saw it.
//!
//! Every round emits `accepted + 1` tokens: the accepted drafts, then exactly one recovered or
//! bonus token ([`Verdict::next`]). Rollback is the caller's job: the target cache keeps the
//! anchor plus the accepted drafts, so it drops `d − accepted` of the `d + 1` scored rows.
//!
//! Losslessness. [`greedy_accept`] emits exactly the tokens plain greedy decoding of the target
//! would emit. [`speculative_sample`] (Leviathan et al. 2023; Chen et al. 2023) emits a token
//! distributed exactly as `p`, whatever `q` is; [`step_distribution`] computes that emitted
//! distribution analytically so tests can check it. Both rules hold only if `p` and `q` went
//! through the *same* processing (temperature, top-k, top-p, min-p). The caller applies those
//! filters before calling in; this module sees only the final probability rows.

use thiserror::Error;

/// How far a probability row's sum may stray from 1 before it is rejected as a distribution.
pub const ROW_SUM_TOLERANCE: f64 = 1e-3;

/// Residual mass at or below this counts as zero: `p ≤ q` everywhere, so `p == q` for two
/// distributions, up to rounding, and the residual falls back to `p` (docs/verify.md, "The
/// residual-mass epsilon").
pub const RESIDUAL_MASS_EPSILON: f64 = 1e-12;

/// The one token the verifier adds after the accepted drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NextToken {
    /// A draft was rejected. This token replaces it (greedy: the target argmax; sampled: a
    /// draw from the residual).
    Recovered(u32),
    /// Every draft was accepted. This token comes from the target row after the last draft.
    Bonus(u32),
}

impl NextToken {
    /// The token id, whichever kind it is.
    pub fn token(self) -> u32 {
        match self {
            NextToken::Recovered(t) | NextToken::Bonus(t) => t,
        }
    }

    /// True for [`NextToken::Bonus`].
    pub fn is_bonus(self) -> bool {
        matches!(self, NextToken::Bonus(_))
    }
}

/// The outcome of verifying one round of drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// Length of the kept draft prefix, `0..=d`.
    pub accepted: usize,
    /// The recovered or bonus token emitted after the accepted drafts.
    pub next: NextToken,
}

impl Verdict {
    /// Tokens this round emits: the accepted drafts plus the recovered/bonus token.
    pub fn emitted(&self) -> usize {
        self.accepted + 1
    }
}

/// Which side of the round a probability row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// A proposer row `q_k`.
    Draft,
    /// A scorer row `p_k`.
    Target,
}

impl std::fmt::Display for RowKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RowKind::Draft => "draft",
            RowKind::Target => "target",
        })
    }
}

/// Invalid input to [`speculative_sample`]. Every variant is a caller bug: a well-formed round
/// never produces one.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// Wrong number of probability rows: `d` draft rows and `d + 1` target rows are required.
    #[error("expected {expected} {kind} probability rows, got {got}")]
    RowCount {
        /// Draft (q) or target (p) rows.
        kind: RowKind,
        /// Rows required.
        expected: usize,
        /// Rows given.
        got: usize,
    },
    /// The target rows have zero width.
    #[error("probability rows are empty (vocabulary size 0)")]
    EmptyVocab,
    /// A row's width differs from the vocabulary size set by target row 0.
    #[error("{kind} row {row} has {got} entries, expected the vocabulary size {expected}")]
    RowWidth {
        /// Draft (q) or target (p) rows.
        kind: RowKind,
        /// 0-based row index.
        row: usize,
        /// The vocabulary size.
        expected: usize,
        /// The row's width.
        got: usize,
    },
    /// A row holds a negative, NaN or infinite probability.
    #[error("{kind} row {row} has invalid probability {value} at token {token}")]
    InvalidProbability {
        /// Draft (q) or target (p) rows.
        kind: RowKind,
        /// 0-based row index.
        row: usize,
        /// Token id of the bad entry.
        token: usize,
        /// The entry.
        value: f32,
    },
    /// A row does not sum to 1 within [`ROW_SUM_TOLERANCE`].
    #[error("{kind} row {row} sums to {sum}, not 1 (tolerance {ROW_SUM_TOLERANCE})")]
    RowSum {
        /// Draft (q) or target (p) rows.
        kind: RowKind,
        /// 0-based row index.
        row: usize,
        /// The row's sum, in f64.
        sum: f64,
    },
    /// A draft id is not in the vocabulary.
    #[error("draft {position} is token {token}, outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// 0-based draft position.
        position: usize,
        /// The draft token id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The draft row gives its own sampled token probability 0. A drafter that sampled `x_k`
    /// from `q_k` cannot produce this, so `q` is not the distribution the draft came from.
    #[error("draft {position} (token {token}) has draft probability 0, so it was not sampled from q")]
    ZeroDraftProbability {
        /// 0-based draft position.
        position: usize,
        /// The draft token id.
        token: u32,
    },
    /// [`first_rejection_or_bonus`] got a different number of recovered tokens than flags.
    #[error("expected {expected} recovered tokens (one per acceptance flag), got {got}")]
    RecoveredCount {
        /// Acceptance flags given.
        expected: usize,
        /// Recovered tokens given.
        got: usize,
    },
    /// The uniform source returned a value outside `[0, 1)`.
    #[error("uniform draw {value} is outside [0, 1)")]
    UniformOutOfRange {
        /// The draw.
        value: f32,
    },
}

/// Greedy verification: keep the longest prefix of `drafts` that matches the target argmax,
/// then emit the argmax at the first mismatch (recovered) or after the last draft (bonus).
///
/// `target_argmax[i]` is the argmax of scorer row `i`, so it has `drafts.len() + 1` entries.
/// The result equals plain greedy decoding of the target for any drafter.
///
/// # Panics
///
/// If `target_argmax.len() != drafts.len() + 1`. The scorer always returns `d + 1` rows, so a
/// mismatch is a bug in the caller, not bad data.
pub fn greedy_accept(drafts: &[u32], target_argmax: &[u32]) -> Verdict {
    assert_eq!(
        target_argmax.len(),
        drafts.len() + 1,
        "greedy_accept: target_argmax must have one entry per draft plus one"
    );
    let accepted = drafts.iter().zip(target_argmax).take_while(|(draft, target)| draft == target).count();
    let token = target_argmax[accepted];
    let next = if accepted == drafts.len() { NextToken::Bonus(token) } else { NextToken::Recovered(token) };
    Verdict { accepted, next }
}

/// The one selection rule of every verifier: the accepted prefix ends at the first draft whose
/// flag is false, and that position's recovered token follows it; if every flag is true, the
/// bonus token follows. `accepted[k]` says whether draft `k` passed its test (greedy: it equals
/// the target's pick; sampled: `u·q(x) < p(x)`), `recovered[k]` is the token emitted if draft
/// `k` is the first rejected one. The device verifier computes every flag and candidate in one
/// pass and calls this on the host copy; [`greedy_accept`] and [`speculative_sample`] are the
/// sequential references it is property-tested against.
pub fn first_rejection_or_bonus(accepted: &[bool], recovered: &[u32], bonus: u32) -> Result<Verdict, AcceptError> {
    if recovered.len() != accepted.len() {
        return Err(AcceptError::RecoveredCount { expected: accepted.len(), got: recovered.len() });
    }
    Ok(match accepted.iter().position(|&ok| !ok) {
        Some(k) => Verdict { accepted: k, next: NextToken::Recovered(recovered[k]) },
        None => Verdict { accepted: accepted.len(), next: NextToken::Bonus(bonus) },
    })
}

/// The residual distribution `normalize(max(p − q, 0))`, which a rejected position samples from.
///
/// Returns `None` when the positive part has no mass (at most [`RESIDUAL_MASS_EPSILON`]). That
/// happens only when `p ≤ q` everywhere, which for two distributions means `p == q` (up to
/// rounding). A rejection then has probability 0, so a caller that still needs a token samples
/// from `p` itself; [`speculative_sample`] does exactly that.
///
/// # Panics
///
/// If `p` and `q` have different lengths.
pub fn residual(p: &[f32], q: &[f32]) -> Option<Vec<f32>> {
    assert_eq!(p.len(), q.len(), "residual: p and q must have the same length");
    let mass = residual_mass(p, q);
    if mass <= RESIDUAL_MASS_EPSILON {
        return None;
    }
    Some(residual_weights(p, q).map(|w| (w / mass) as f32).collect())
}

/// Speculative sampling (rejection verification) over host probability rows.
///
/// - `drafts`: the `d` proposed tokens; `x_k` was sampled from `q_rows[k]`.
/// - `q_rows`: `d` draft rows, `q_rows[k]` is the distribution `x_k` was drawn from.
/// - `p_rows`: `d + 1` target rows from one scorer pass; the same filters as `q`.
/// - `uniforms`: independent draws in `[0, 1)`.
///
/// For `k = 0..d`, draft `x_k` is accepted with probability `min(1, p_k(x_k) / q_k(x_k))`: one
/// uniform `u` is drawn and the draft is kept iff `u · q_k(x_k) < p_k(x_k)`. On the first
/// rejection the recovered token is drawn from [`residual`]`(p_k, q_k)` (or from `p_k` if the
/// residual is empty) and the rest of the drafts are discarded. If every draft is accepted, the
/// bonus token is drawn from `p_rows[d]`. Each draw from a row uses inverse-CDF sampling with one
/// uniform. A round therefore uses `k + 2` uniforms when draft `k` is rejected and `d + 1` when
/// all drafts are accepted.
///
/// All inputs are checked before any uniform is drawn, so an error never depends on the draws.
pub fn speculative_sample(
    drafts: &[u32],
    q_rows: &[&[f32]],
    p_rows: &[&[f32]],
    uniforms: &mut impl FnMut() -> f32,
) -> Result<Verdict, AcceptError> {
    let d = drafts.len();
    validate_round(drafts, q_rows, p_rows)?;

    for (k, (&x, (&q, &p))) in drafts.iter().zip(q_rows.iter().zip(p_rows)).enumerate() {
        // `validate_round` checked `x` against the vocabulary and `q[x] > 0`.
        let q_x = f64::from(q[x as usize]);
        let p_x = f64::from(p[x as usize]);
        let u = f64::from(draw(uniforms)?);
        if u * q_x < p_x {
            continue;
        }
        let u = draw(uniforms)?;
        let token = if residual_mass(p, q) > RESIDUAL_MASS_EPSILON {
            sample_inverse_cdf(residual_weights(p, q), u)
        } else {
            sample_inverse_cdf(p.iter().map(|&v| f64::from(v)), u)
        };
        return Ok(Verdict { accepted: k, next: NextToken::Recovered(token) });
    }

    let u = draw(uniforms)?;
    let token = sample_inverse_cdf(p_rows[d].iter().map(|&v| f64::from(v)), u);
    Ok(Verdict { accepted: d, next: NextToken::Bonus(token) })
}

/// The exact distribution of the token emitted by one speculative step: one draft drawn from
/// `q`, judged against `p`, then the recovered token on rejection. In f64:
///
/// `P(t) = q(t)·min(1, p(t)/q(t)) + (1 − Σ_s q(s)·min(1, p(s)/q(s)))·residual(t)`
///
/// where `q(t)·min(1, p(t)/q(t)) = min(p(t), q(t))` and `residual` falls back to `p` when it is
/// empty, as in [`speculative_sample`]. For distributions `p` and `q` this equals `p`: that
/// identity is the losslessness of speculative sampling.
///
/// # Panics
///
/// If `p` and `q` have different lengths.
pub fn step_distribution(p: &[f32], q: &[f32]) -> Vec<f64> {
    assert_eq!(p.len(), q.len(), "step_distribution: p and q must have the same length");
    let accept = |(&pt, &qt): (&f32, &f32)| f64::from(pt).min(f64::from(qt));
    let accepted_mass: f64 = p.iter().zip(q).map(accept).sum();
    let reject = 1.0 - accepted_mass;
    let mass = residual_mass(p, q);
    let fallback: Vec<f64> = if mass > RESIDUAL_MASS_EPSILON {
        residual_weights(p, q).map(|w| w / mass).collect()
    } else {
        p.iter().map(|&v| f64::from(v)).collect()
    };
    p.iter().zip(q).zip(fallback).map(|(pq, r)| accept(pq) + reject * r).collect()
}

/// `max(p − q, 0)` per token, in f64.
fn residual_weights<'a>(p: &'a [f32], q: &'a [f32]) -> impl Iterator<Item = f64> + Clone + 'a {
    p.iter().zip(q).map(|(&pt, &qt)| (f64::from(pt) - f64::from(qt)).max(0.0))
}

fn residual_mass(p: &[f32], q: &[f32]) -> f64 {
    residual_weights(p, q).sum()
}

/// Index of the first token whose cumulative weight exceeds `u · total`. Zero-weight tokens are
/// never returned; if rounding leaves `u · total` past the last step, the last token with
/// positive weight is returned. The caller guarantees some weight is positive.
fn sample_inverse_cdf(weights: impl Iterator<Item = f64> + Clone, u: f32) -> u32 {
    let total: f64 = weights.clone().sum();
    let target = f64::from(u) * total;
    let mut cumulative = 0.0;
    let mut last_positive = 0usize;
    for (i, w) in weights.enumerate() {
        if w <= 0.0 {
            continue;
        }
        cumulative += w;
        last_positive = i;
        if target < cumulative {
            return index_to_token(i);
        }
    }
    index_to_token(last_positive)
}

/// Token ids are `u32`, so a real row never has an index past `u32::MAX`; saturate rather than
/// panic if one somehow does.
fn index_to_token(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

fn draw(uniforms: &mut impl FnMut() -> f32) -> Result<f32, AcceptError> {
    let value = uniforms();
    if (0.0..1.0).contains(&value) {
        Ok(value)
    } else {
        Err(AcceptError::UniformOutOfRange { value })
    }
}

fn validate_round(drafts: &[u32], q_rows: &[&[f32]], p_rows: &[&[f32]]) -> Result<(), AcceptError> {
    let d = drafts.len();
    if q_rows.len() != d {
        return Err(AcceptError::RowCount { kind: RowKind::Draft, expected: d, got: q_rows.len() });
    }
    if p_rows.len() != d + 1 {
        return Err(AcceptError::RowCount { kind: RowKind::Target, expected: d + 1, got: p_rows.len() });
    }
    let vocab = p_rows[0].len();
    if vocab == 0 {
        return Err(AcceptError::EmptyVocab);
    }
    for (kind, rows) in [(RowKind::Target, p_rows), (RowKind::Draft, q_rows)] {
        for (row, values) in rows.iter().enumerate() {
            validate_row(kind, row, values, vocab)?;
        }
    }
    for (position, (&token, q)) in drafts.iter().zip(q_rows).enumerate() {
        let Some(&q_x) = q.get(token as usize) else {
            return Err(AcceptError::TokenOutOfVocab { position, token, vocab });
        };
        if q_x <= 0.0 {
            return Err(AcceptError::ZeroDraftProbability { position, token });
        }
    }
    Ok(())
}

fn validate_row(kind: RowKind, row: usize, values: &[f32], vocab: usize) -> Result<(), AcceptError> {
    if values.len() != vocab {
        return Err(AcceptError::RowWidth { kind, row, expected: vocab, got: values.len() });
    }
    let mut sum = 0.0f64;
    for (token, &value) in values.iter().enumerate() {
        if !value.is_finite() || value < 0.0 {
            return Err(AcceptError::InvalidProbability { kind, row, token, value });
        }
        sum += f64::from(value);
    }
    if (sum - 1.0).abs() > ROW_SUM_TOLERANCE {
        return Err(AcceptError::RowSum { kind, row, sum });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(values: Vec<f32>) -> impl FnMut() -> f32 {
        let mut it = values.into_iter();
        move || it.next().unwrap_or(0.0)
    }

    #[test]
    fn greedy_full_match_is_bonus() {
        let v = greedy_accept(&[1, 2, 3], &[1, 2, 3, 9]);
        assert_eq!(v, Verdict { accepted: 3, next: NextToken::Bonus(9) });
        assert_eq!(v.emitted(), 4);
    }

    #[test]
    fn greedy_mismatch_is_recovered_argmax() {
        let v = greedy_accept(&[1, 5, 3], &[1, 2, 3, 9]);
        assert_eq!(v, Verdict { accepted: 1, next: NextToken::Recovered(2) });
    }

    #[test]
    fn greedy_without_drafts_emits_bonus() {
        assert_eq!(greedy_accept(&[], &[7]), Verdict { accepted: 0, next: NextToken::Bonus(7) });
    }

    #[test]
    fn residual_of_equal_rows_is_none() {
        assert_eq!(residual(&[0.25, 0.75], &[0.25, 0.75]), None);
    }

    #[test]
    fn draft_the_target_rules_out_is_rejected_and_recovered_from_residual() {
        // p never emits token 0; q always drafts it. Every draw rejects, and the residual is
        // p restricted to where p > q: tokens 1 and 2 in proportion 1:3.
        let p: &[f32] = &[0.0, 0.25, 0.75];
        let q: &[f32] = &[1.0, 0.0, 0.0];
        let v = speculative_sample(&[0], &[q], &[p, p], &mut fixed(vec![0.0, 0.2])).unwrap();
        assert_eq!(v, Verdict { accepted: 0, next: NextToken::Recovered(1) });
        let v = speculative_sample(&[0], &[q], &[p, p], &mut fixed(vec![0.999, 0.3])).unwrap();
        assert_eq!(v, Verdict { accepted: 0, next: NextToken::Recovered(2) });
    }

    #[test]
    fn acceptance_threshold_is_p_over_q() {
        let p: &[f32] = &[0.3, 0.7];
        let q: &[f32] = &[0.6, 0.4];
        // p/q at token 0 is 0.5: u = 0.49 accepts, u = 0.5 rejects.
        let v = speculative_sample(&[0], &[q], &[p, p], &mut fixed(vec![0.49, 0.9])).unwrap();
        assert_eq!(v, Verdict { accepted: 1, next: NextToken::Bonus(1) });
        let v = speculative_sample(&[0], &[q], &[p, p], &mut fixed(vec![0.5, 0.9])).unwrap();
        assert_eq!(v, Verdict { accepted: 0, next: NextToken::Recovered(1) });
    }

    #[test]
    fn zero_draft_probability_is_a_caller_error() {
        let p: &[f32] = &[0.5, 0.5];
        let q: &[f32] = &[1.0, 0.0];
        let err = speculative_sample(&[1], &[q], &[p, p], &mut fixed(vec![0.0, 0.0])).unwrap_err();
        assert_eq!(err, AcceptError::ZeroDraftProbability { position: 0, token: 1 });
    }

    #[test]
    fn malformed_rounds_are_refused() {
        let p: &[f32] = &[0.5, 0.5];
        let bad: &[f32] = &[0.5, 0.4];
        let neg: &[f32] = &[1.5, -0.5];
        let mut u = fixed(vec![]);
        assert!(matches!(
            speculative_sample(&[0], &[], &[p, p], &mut u),
            Err(AcceptError::RowCount { kind: RowKind::Draft, expected: 1, got: 0 })
        ));
        assert!(matches!(
            speculative_sample(&[0], &[p], &[p], &mut u),
            Err(AcceptError::RowCount { kind: RowKind::Target, expected: 2, got: 1 })
        ));
        assert!(matches!(
            speculative_sample(&[0], &[bad], &[p, p], &mut u),
            Err(AcceptError::RowSum { kind: RowKind::Draft, row: 0, .. })
        ));
        assert!(matches!(
            speculative_sample(&[0], &[p], &[p, neg], &mut u),
            Err(AcceptError::InvalidProbability { kind: RowKind::Target, row: 1, token: 1, .. })
        ));
        assert!(matches!(
            speculative_sample(&[2], &[p], &[p, p], &mut u),
            Err(AcceptError::TokenOutOfVocab { position: 0, token: 2, vocab: 2 })
        ));
        assert!(matches!(
            speculative_sample(&[0], &[&[1.0, 0.0, 0.0]], &[p, p], &mut u),
            Err(AcceptError::RowWidth { kind: RowKind::Draft, row: 0, expected: 2, got: 3 })
        ));
        assert!(matches!(
            speculative_sample(&[0], &[p], &[p, p], &mut || 1.0),
            Err(AcceptError::UniformOutOfRange { .. })
        ));
    }
}
