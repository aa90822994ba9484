//! How many drafts to propose when the throughput schedule picks the verify window.
//!
//! The schedule sees a block's confidences only after the drafter has proposed it, and
//! proposing costs per position (the LM head row, the Markov step and its draw). When recent
//! rounds verified three drafts of six, drafting all six wastes half of that work. The cap
//! proposes one more position than the longest recent window (two more when that window took
//! every position offered, since the schedule might have gone further), at most γ.
//!
//! Exactness: the cap depends only on earlier rounds, so within a round it is a fixed bound
//! decided before any draft is seen; truncating a block at a fixed length, then at the
//! schedule's stopping time, keeps speculative sampling exact.

use std::collections::VecDeque;

/// The recent windows and the largest block.
#[derive(Clone, Debug)]
pub struct DraftCap {
    gamma: usize,
    /// Per recent round: the drafts the next proposal should allow for.
    wanted: VecDeque<usize>,
}

impl DraftCap {
    /// Rounds remembered: a single short round (an unlucky block) does not shrink the cap.
    pub const MEMORY: usize = 4;

    /// No history yet: the first round proposes the whole block.
    pub fn new(gamma: usize) -> DraftCap {
        DraftCap { gamma, wanted: VecDeque::with_capacity(Self::MEMORY) }
    }

    /// Drafts to ask the drafter for in the next round (1..=γ; γ without history).
    pub fn limit(&self) -> usize {
        match self.wanted.iter().max() {
            Some(&w) => w.clamp(1, self.gamma.max(1)),
            None => self.gamma,
        }
    }

    /// Records a round that was offered `offered` drafts and verified `window` of them.
    pub fn record(&mut self, offered: usize, window: usize) {
        if self.wanted.len() == Self::MEMORY {
            self.wanted.pop_front();
        }
        let growth = if window >= offered { 2 } else { 1 };
        self.wanted.push_back(window + growth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_with_the_whole_block() {
        assert_eq!(DraftCap::new(6).limit(), 6);
    }

    #[test]
    fn follows_the_longest_recent_window() {
        let mut cap = DraftCap::new(6);
        cap.record(6, 2);
        assert_eq!(cap.limit(), 3, "one past a window the schedule chose to stop at");
        cap.record(3, 1);
        assert_eq!(cap.limit(), 3, "the longest of the remembered rounds counts");
        for _ in 0..DraftCap::MEMORY {
            cap.record(3, 0);
        }
        assert_eq!(cap.limit(), 1, "plain steps still propose one draft, so the schedule can look again");
    }

    #[test]
    fn grows_when_a_window_took_every_draft_offered_and_never_passes_gamma() {
        let mut cap = DraftCap::new(6);
        cap.record(6, 1);
        assert_eq!(cap.limit(), 2);
        cap.record(2, 2);
        assert_eq!(cap.limit(), 4);
        cap.record(4, 4);
        cap.record(6, 6);
        assert_eq!(cap.limit(), 6);
    }
}
