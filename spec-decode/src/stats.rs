//! Per-request statistics. One convention: `emitted` counts tokens returned to the caller (stop
//! tokens are not emitted); a round is one target verify forward; τ is accepted + 1 per round.

/// Counters of one speculative request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens returned to the caller.
    pub emitted: usize,
    /// Drafts verified (after pruning).
    pub drafted: usize,
    /// Drafts accepted by the verifier (a stop token ending the round early can leave some
    /// of them unemitted).
    pub accepted: usize,
    /// Speculative rounds: verify forwards that carried at least one draft.
    pub rounds: usize,
    /// Target forwards after the prefill that carried no draft (the last token of a request
    /// when only one was left to emit); plain decode steps, not counted in τ.
    pub plain_steps: usize,
    /// Requests that ended on a stop token (produced by the target but not emitted): 0 or 1
    /// for one request, a count after [`SpecStats::absorb`].
    pub stops: usize,
    /// `drafted_by_pos[i]`: rounds that verified a draft at block position i.
    pub drafted_by_pos: Vec<usize>,
    /// `accepted_by_pos[i]`: rounds that accepted the draft at block position i.
    pub accepted_by_pos: Vec<usize>,
    /// Target forwards of the prompt (chunks).
    pub prefill_forwards: usize,
    /// Host synchronisations (device → host reads) during decoding.
    pub host_syncs: usize,
    /// Prefill wall time, in milliseconds.
    pub prefill_ms: f64,
    /// Decode wall time after the prefill, in milliseconds.
    pub decode_ms: f64,
}

impl SpecStats {
    /// accepted / drafted.
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Mean accepted length τ: (accepted + 1) per round.
    pub fn tau(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            (self.accepted + self.rounds) as f64 / self.rounds as f64
        }
    }

    /// Emitted tokens per second of decoding.
    pub fn decode_tok_per_s(&self) -> f64 {
        if self.decode_ms > 0.0 {
            self.emitted as f64 / (self.decode_ms / 1e3)
        } else {
            0.0
        }
    }

    /// Target forwards after the prefill: speculative rounds plus plain steps.
    pub fn target_forwards(&self) -> usize {
        self.rounds + self.plain_steps
    }

    /// Target forwards plain decoding would have run for the same tokens, minus ours. Plain
    /// decoding runs one forward per token the target produced: every emitted token, plus the
    /// stop token of each request that ended on one.
    pub fn forwards_saved(&self) -> usize {
        (self.emitted + self.stops).saturating_sub(self.target_forwards())
    }

    /// Host syncs per target forward.
    pub fn syncs_per_round(&self) -> f64 {
        if self.target_forwards() == 0 {
            0.0
        } else {
            self.host_syncs as f64 / self.target_forwards() as f64
        }
    }

    pub(crate) fn record_round(&mut self, drafted: usize, accepted: usize) {
        self.rounds += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        if self.drafted_by_pos.len() < drafted {
            self.drafted_by_pos.resize(drafted, 0);
            self.accepted_by_pos.resize(drafted, 0);
        }
        for i in 0..drafted {
            self.drafted_by_pos[i] += 1;
        }
        for i in 0..accepted {
            self.accepted_by_pos[i] += 1;
        }
    }

    /// Adds another request's counters and times (totals over several requests).
    pub fn absorb(&mut self, o: &SpecStats) {
        self.prompt_tokens += o.prompt_tokens;
        self.emitted += o.emitted;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.rounds += o.rounds;
        self.plain_steps += o.plain_steps;
        self.stops += o.stops;
        for (mine, theirs) in
            [(&mut self.drafted_by_pos, &o.drafted_by_pos), (&mut self.accepted_by_pos, &o.accepted_by_pos)]
        {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            mine.iter_mut().zip(theirs).for_each(|(m, t)| *m += t);
        }
        self.prefill_forwards += o.prefill_forwards;
        self.host_syncs += o.host_syncs;
        self.prefill_ms += o.prefill_ms;
        self.decode_ms += o.decode_ms;
    }

    /// Per-position acceptance, `accepted/drafted` for block positions 0, 1, ….
    pub fn by_position(&self) -> String {
        self.accepted_by_pos
            .iter()
            .zip(&self.drafted_by_pos)
            .map(|(a, d)| format!("{a}/{d}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        format!(
            "emitted {} | rounds {} | drafted {} accepted {} ({:.1}%) | τ {:.2} | forwards saved {} | {:.1} tok/s | {:.2} host syncs/round | prefill {:.1} ms",
            self.emitted,
            self.rounds,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance_rate(),
            self.tau(),
            self.forwards_saved(),
            self.decode_tok_per_s(),
            self.syncs_per_round(),
            self.prefill_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_steps_are_not_rounds() {
        let mut s = SpecStats::default();
        s.record_round(4, 3); // 4 tokens
        s.record_round(4, 0); // 1 token
        s.plain_steps = 1; // the last token, drafted by nobody
        s.emitted = 6;
        assert_eq!(s.rounds, 2);
        assert!((s.tau() - 2.5).abs() < 1e-12, "τ counts speculative rounds only: {}", s.tau());
        assert_eq!(s.forwards_saved(), 3, "6 plain forwards against our 3");
    }

    #[test]
    fn a_stop_token_costs_plain_decoding_a_forward_too() {
        let mut s = SpecStats::default();
        s.record_round(3, 3); // drafts a b c + bonus d
        s.record_round(3, 1); // draft e, then the recovered token is the stop token
        s.emitted = 5;
        s.stops = 1;
        // Plain decoding: a b c d e <stop> = 6 forwards; ours: 2.
        assert_eq!(s.forwards_saved(), 4);
    }
}
