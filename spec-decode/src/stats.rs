//! Per-request statistics. One convention: `emitted` counts tokens returned to the caller (stop
//! tokens are not emitted); a round is one target verify forward; τ is accepted + 1 per round.

/// Counters of one speculative request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    pub prompt_tokens: usize,
    /// Tokens returned to the caller.
    pub emitted: usize,
    /// Drafts verified (after pruning).
    pub drafted: usize,
    /// Drafts accepted by the verifier (a stop token ending the round early can leave some
    /// of them unemitted).
    pub accepted: usize,
    /// Verify rounds (= target forwards after the prefill).
    pub rounds: usize,
    /// `drafted_by_pos[i]`: rounds that verified a draft at block position i.
    pub drafted_by_pos: Vec<usize>,
    /// `accepted_by_pos[i]`: rounds that accepted the draft at block position i.
    pub accepted_by_pos: Vec<usize>,
    /// Target forwards of the prompt (chunks).
    pub prefill_forwards: usize,
    /// Host synchronisations (device → host reads) during decoding.
    pub host_syncs: usize,
    pub prefill_ms: f64,
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

    /// Target forwards plain decoding would have run for the same tokens, minus ours.
    pub fn forwards_saved(&self) -> usize {
        self.emitted.saturating_sub(self.rounds)
    }

    /// Host syncs per round.
    pub fn syncs_per_round(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.host_syncs as f64 / self.rounds as f64
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
