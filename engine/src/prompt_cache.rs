//! The prompt cache: target KV caches and drafter inputs (tapped rows) of recent prompts'
//! prefixes, so a request that shares a prefix with an earlier one resumes its prefill there.
//!
//! Reuse is exact by construction: an entry is a [`PrefixState`] that the prefill passed
//! through on its chunk grid, and [`spec_decode::prefill_from`] resumes only where a
//! from-scratch prefill of the new prompt passes through the very same state (a chunk boundary
//! of the same grid, or the new prompt's whole head). The remaining chunks are then the same
//! forwards on the same inputs, so outputs are bit-identical with and without the cache. Kept
//! per prompt: the state after its whole head (exact repeats, or the same prompt with another
//! last token) and after its last full chunk (longer prompts that extend it, such as the next
//! turn of a conversation).

use std::collections::VecDeque;

use gemma4::TapSet;
use spec_decode::PrefixState;

/// Least-recently-used prefix states, at most `capacity`.
pub struct PromptCache {
    entries: VecDeque<PrefixState>,
    capacity: usize,
}

impl PromptCache {
    /// An empty cache holding at most `capacity` states (0 keeps none).
    pub fn new(capacity: usize) -> PromptCache {
        PromptCache { entries: VecDeque::new(), capacity }
    }

    /// The longest state `prompt` can resume from (tapped with `taps`, chunks of `step`),
    /// marked as recently used.
    pub fn lookup(&mut self, taps: &TapSet, prompt: &[u32], step: usize) -> Option<PrefixState> {
        let (i, _) = self
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.resumable_for(taps, prompt, step))
            .max_by_key(|(_, e)| e.tokens().len())?;
        let e = self.entries.remove(i)?;
        self.entries.push_back(e.clone());
        Some(e)
    }

    /// Keeps `state` (replacing one for the same tokens), evicting the least recently used.
    pub fn insert(&mut self, state: PrefixState) {
        if self.capacity == 0 || state.tokens().is_empty() {
            return;
        }
        self.entries.retain(|e| e.tokens() != state.tokens());
        self.entries.push_back(state);
        while self.entries.len() > self.capacity {
            self.entries.pop_front();
        }
    }

    /// States held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
