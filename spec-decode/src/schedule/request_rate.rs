//! The tokens per decode step a request has achieved so far, which the throughput schedule's
//! rate rule ([`crate::schedule::throughput::rate_window`]) prices each draft against.
//!
//! Exactness: the rate depends only on earlier rounds, so within a round it is a constant fixed
//! before any draft is seen and the window stays a stopping time of the current block.

/// Tokens emitted and round cost (in decode steps, from the profile) summed over the rounds so
/// far.
#[derive(Clone, Debug, Default)]
pub struct RequestRate {
    tokens: f64,
    cost: f64,
    rounds: usize,
}

impl RequestRate {
    /// Rounds before the rate is trusted; until then the schedule uses the round's own ratio
    /// (the paper's Algorithm 1). One round's outcome is too noisy to price the next.
    pub const WARM_UP: usize = 2;

    /// Records a round that emitted `tokens` (accepted drafts plus the bonus or correction) at
    /// `cost` decode steps.
    pub fn record(&mut self, tokens: usize, cost: f32) {
        if cost.is_finite() && cost > 0.0 {
            self.tokens += tokens as f64;
            self.cost += cost as f64;
            self.rounds += 1;
        }
    }

    /// Tokens per decode step so far, once warmed up.
    pub fn rate(&self) -> Option<f64> {
        (self.rounds >= Self::WARM_UP && self.cost > 0.0).then(|| self.tokens / self.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_tokens_over_cost_after_the_warm_up() {
        let mut r = RequestRate::default();
        assert_eq!(r.rate(), None);
        r.record(4, 1.2);
        assert_eq!(r.rate(), None, "one round is not enough");
        r.record(1, 1.0);
        r.record(2, f32::NAN);
        let rate = r.rate().unwrap();
        assert!((rate - 5.0 / 2.2).abs() < 1e-6, "{rate}: a round without a finite cost is not counted");
    }
}
