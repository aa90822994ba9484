//! Hardware-aware draft length for one request (the paper's Algorithm 1): with calibrated
//! survivals a_j = ∏_{i≤j} c_i and the profiled verify cost v(n) = T_verify(n) / T_decode(1),
//! admit draft positions in order while the expected throughput
//! Θ(ℓ) = (1 + Σ_{j≤ℓ} a_j) / v(1 + ℓ) improves, and stop at the first position that does not
//! improve it. Stopping there (never looking past a non-improving position) makes the window a
//! stopping time of the drafts already seen, which keeps speculative sampling exact; choosing
//! the window after seeing every confidence would not be. [`rate_window`] is the same early stop
//! with each draft priced at the request's achieved rate instead of the round's own ratio; the
//! loop uses it once a request has that rate.

/// The number of drafts to verify (0 = a plain decode step) for a block whose survivals are
/// `survival[j]` (position j, 0-based) under verify costs `cost[n - 1]` = v(n), n = 1, 2, ….
/// Never longer than the block or the profile allows; never admits a survival ≤ 0.
pub fn throughput_window(survival: &[f32], cost: &[f32]) -> usize {
    early_stop_window(survival, cost, None)
}

/// The window that maximises the request's long-run throughput rather than this round's: with
/// `rate` λ the tokens per decode step the request has achieved so far, admit position j (0-based)
/// while its survival pays for its marginal cost at that rate, a_j > λ · (v(j + 2) − v(j + 1)),
/// and stop at the first that does not (the same early stop, so still a stopping time). A rate
/// that is not positive and finite falls back to [`throughput_window`].
///
/// Why not the round's own ratio: tokens per step over many rounds is Σ tokens / Σ cost, which
/// is maximised by maximising each round's tokens − λ* · cost at the best achievable λ*
/// (fractional programming), not each round's own ratio. The per-round ratio is strictest in
/// the rounds whose early drafts are most likely accepted (their ratio is high) and most lenient
/// in the unlikely ones, the opposite of what the confidences are for.
pub fn rate_window(survival: &[f32], cost: &[f32], rate: f64) -> usize {
    early_stop_window(survival, cost, (rate.is_finite() && rate > 0.0).then_some(rate))
}

/// Both rules are one early stop: admit position j while a_j > price · (v(j + 2) − v(j + 1)).
/// Θ improves exactly when the price is the round's own Θ so far, since (E + a) / v′ > E / v
/// ⇔ a > (E / v) · (v′ − v) for positive costs; the rate rule fixes the price at `rate`.
fn early_stop_window(survival: &[f32], cost: &[f32], rate: Option<f64>) -> usize {
    let Some(&base) = cost.first() else { return 0 };
    if !(base.is_finite() && base > 0.0) {
        return 0;
    }
    let mut expected = 1f64; // tokens a round emits: the bonus/correction plus accepted drafts
    let mut prev = base as f64; // cost of the window admitted so far
    let mut window = 0;
    for (j, &a) in survival.iter().enumerate() {
        let Some(&v) = cost.get(j + 1) else { break };
        if !(a.is_finite() && a > 0.0 && v.is_finite() && v > 0.0) {
            break;
        }
        let price = rate.unwrap_or(expected / prev);
        if a as f64 <= price * (v as f64 - prev) {
            break;
        }
        expected += a as f64;
        prev = v as f64;
        window = j + 1;
    }
    window
}

/// The window a look-ahead scheduler picks: the ℓ with the best Θ(ℓ) after seeing every
/// survival (ties: the shorter). Deciding whether to verify draft j from confidences that
/// depend on draft j itself biases speculative sampling; this exists only so the statistical
/// gate can show that its test rejects such a scheduler.
pub fn look_ahead_window(survival: &[f32], cost: &[f32]) -> usize {
    let mut expected = 1f64;
    let mut best = (
        0usize,
        match cost.first() {
            Some(&v) if v.is_finite() && v > 0.0 => 1.0 / v as f64,
            _ => return 0,
        },
    );
    for (j, &a) in survival.iter().enumerate() {
        let Some(&v) = cost.get(j + 1) else { break };
        if !(a.is_finite() && a > 0.0 && v.is_finite() && v > 0.0) {
            break;
        }
        expected += a as f64;
        if expected / v as f64 > best.1 {
            best = (j + 1, expected / v as f64);
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAT: [f32; 9] = [1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3, 1.35, 1.4];

    #[test]
    fn admits_a_leading_prefix_while_it_pays() {
        assert_eq!(throughput_window(&[0.9, 0.8, 0.7, 0.6], &FLAT), 4);
        // Θ: 1 → 1.9/1.05 → 1.95/1.1 = 1.77 < 1.81: stops after one.
        assert_eq!(throughput_window(&[0.9, 0.05, 0.04], &FLAT), 1);
    }

    #[test]
    fn never_admits_a_zero_survival_or_looks_past_a_stop() {
        assert_eq!(throughput_window(&[0.9, 0.0, 0.9], &[1.0, 1.0, 1.0, 1.0]), 1, "free verify, zero survival");
        // Position 1 does not pay, position 2 would: the early stop never reaches it.
        assert_eq!(throughput_window(&[0.9, 0.01, 0.99], &FLAT), 1);
        assert_eq!(throughput_window(&[f32::NAN, 0.9], &FLAT), 0);
    }

    #[test]
    fn respects_a_cost_cliff_and_the_block_length() {
        let cliff = [1.0, 1.05, 1.1, 3.0, 3.05];
        assert_eq!(throughput_window(&[0.95, 0.9, 0.85, 0.8], &cliff), 2, "v jumps at 4 tokens: stop before");
        assert_eq!(throughput_window(&[0.99; 3], &FLAT), 3, "never more than the block");
        assert_eq!(throughput_window(&[0.99; 8], &FLAT[..4]), 3, "never more than the profile");
    }

    #[test]
    fn look_ahead_skips_a_position_that_does_not_pay_alone() {
        // One draft at 0.4 does not pay for v(2) = 1.5, but two do when the second is likely:
        // the early stop never gets there; the look-ahead does.
        let cost = [1.0, 1.5, 1.6];
        assert_eq!(throughput_window(&[0.4, 0.396], &cost), 0);
        assert_eq!(look_ahead_window(&[0.4, 0.396], &cost), 2);
        assert_eq!(look_ahead_window(&[0.4, 0.004], &cost), 0);
    }

    #[test]
    fn the_rate_rule_prices_each_draft_at_the_request_rate() {
        // Marginal costs 0.05: at λ = 3 a draft pays above 0.15, whatever the round's own ratio.
        assert_eq!(rate_window(&[0.9, 0.8, 0.7, 0.16, 0.1], &FLAT, 3.0), 4);
        assert_eq!(rate_window(&[0.9, 0.8, 0.14, 0.9], &FLAT, 3.0), 2, "stops at the first that does not pay");
        // A likely block the per-round ratio cuts early (its Θ is already high) goes on.
        let likely = [0.95, 0.9, 0.85, 0.8, 0.75, 0.2, 0.15];
        assert_eq!(throughput_window(&likely, &FLAT), 5);
        assert_eq!(rate_window(&likely, &FLAT, 2.0), 7);
        // An unlikely one the per-round ratio admits (its Θ is low) is cut.
        let unlikely = [0.3, 0.1, 0.06];
        assert_eq!(throughput_window(&unlikely, &FLAT), 2);
        assert_eq!(rate_window(&unlikely, &FLAT, 2.5), 1);
        // Leading prefixes only, never a zero survival, a cliff stops it, never past the block.
        assert_eq!(rate_window(&[0.9, 0.0, 0.9], &[1.0, 1.0, 1.0, 1.0], 2.0), 1);
        assert_eq!(rate_window(&[0.95, 0.9, 0.85, 0.8], &[1.0, 1.05, 1.1, 3.0, 3.05], 2.0), 2);
        assert_eq!(rate_window(&[0.99; 3], &FLAT, 2.0), 3);
        assert_eq!(rate_window(&[0.3, 0.9], &[1.0, 1.5, 1.6], 1.0), 0, "0.3 < 1 · 0.5: no draft pays");
        assert_eq!(rate_window(&[0.3, 0.9], &[1.0, 1.5, 1.6], f64::NAN), 0, "no rate: the per-round ratio");
    }

    #[test]
    fn empty_window_when_one_draft_does_not_pay() {
        assert_eq!(throughput_window(&[0.3, 0.9], &[1.0, 1.5, 1.6]), 0, "1.3/1.5 < 1");
        assert_eq!(throughput_window(&[], &FLAT), 0);
        assert_eq!(throughput_window(&[0.9], &[]), 0);
    }
}
