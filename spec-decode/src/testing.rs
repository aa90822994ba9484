//! Fixtures and switches for tests and gates (the `testing` feature): never part of the API a
//! user decodes with.

use gemma4::Model;

use crate::decode::{decode_with_rule, Prefilled, SpecConfig, SpecOutput};
use crate::drafter::Drafter;
use crate::error::Result;

pub use crate::drafters::deepspec::synthetic::{write_synthetic_deepspec, SyntheticDeepSpec};
pub use crate::verify::rule::VerifyRule;

/// [`crate::decode_from`] under a chosen verify rule, so a statistical gate can show that it
/// rejects a broken verifier.
pub fn decode_from_with_rule(
    target: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    cfg: &SpecConfig,
    rule: VerifyRule,
    on_token: impl FnMut(u32),
) -> Result<SpecOutput> {
    decode_with_rule(target, drafter, pre, pre.ctx.clone(), cfg, rule, on_token)
}

/// A drafter whose confidences follow a script, for the scheduler's statistical gate: the
/// first position's confidence is drawn per round from `first` by the wrapper's own generator
/// (independent of the drafts), and position k ≥ 1 gets `later(d_{k−1})`, a function of the
/// previous draft token. So a later confidence depends on an earlier draft, as DSpark's does
/// through its Markov input, and a scheduler that looks ahead sees information about a draft
/// before deciding whether to verify it.
pub struct ScriptedConfidence<D: Drafter> {
    /// The drafter whose drafts are proposed unchanged.
    pub inner: D,
    /// Values the first position's confidence is drawn from, uniformly per round.
    pub first: Vec<f32>,
    /// Confidence of position k ≥ 1 as a function of draft k − 1.
    pub later: Box<dyn Fn(u32) -> f32>,
    /// The `max_drafts` of every proposal request, in order.
    pub asked: Vec<usize>,
    state: u64,
}

impl<D: Drafter> ScriptedConfidence<D> {
    /// Wraps `inner`; `seed` seeds the draws from `first`.
    pub fn new(inner: D, first: Vec<f32>, later: Box<dyn Fn(u32) -> f32>, seed: u64) -> Self {
        ScriptedConfidence { inner, first, later, asked: Vec::new(), state: seed }
    }

    fn next_first(&mut self) -> f32 {
        // SplitMix64.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        self.first.get((z % self.first.len().max(1) as u64) as usize).copied().unwrap_or(0.5)
    }
}

impl<D: Drafter> Drafter for ScriptedConfidence<D> {
    fn name(&self) -> String {
        format!("{} (scripted confidence)", self.inner.name())
    }
    fn gamma(&self) -> usize {
        self.inner.gamma()
    }
    fn taps(&self) -> gemma4::TapSet {
        self.inner.taps()
    }
    fn has_confidence(&self) -> bool {
        true
    }
    fn reset(&mut self, ctx: Option<&mlx_core::Array>, len: usize) -> Result<()> {
        self.inner.reset(ctx, len)
    }
    fn context_len(&self) -> usize {
        self.inner.context_len()
    }
    fn propose(&mut self, req: crate::drafter::DraftRequest<'_>) -> Result<crate::drafter::Proposal> {
        self.asked.push(req.max_drafts);
        let mut p = self.inner.propose(req)?;
        let tokens = p.tokens.to_vec::<u32>()?;
        let mut conf = vec![self.next_first()];
        conf.extend(tokens.iter().take(tokens.len().saturating_sub(1)).map(|&t| (self.later)(t)));
        p.confidence = Some(mlx_core::Array::from_slice(&conf, &[conf.len() as i32])?);
        Ok(p)
    }
    fn commit(&mut self, rows: Option<&mlx_core::Array>, k: usize) -> Result<()> {
        self.inner.commit(rows, k)
    }
}
