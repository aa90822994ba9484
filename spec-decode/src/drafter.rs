//! The proposer side: one trait every drafter implements.
//!
//! Contract per round: the decode loop calls `propose` with the *anchor* (the last emitted token,
//! not yet forwarded through the target) and `n ≤ γ`; the drafter returns `d ∈ 1..=n` drafts
//! (tokens stay on the device, so proposing needs no host read). After verification the loop
//! calls `commit` with the target's tapped rows of the anchor and the accepted drafts; rejected
//! rows are never committed, so a drafter's context always holds exactly the committed tokens.

use gemma4::sampling::SamplerConfig;
use gemma4::{Cache, Model, TapSet};
use mlx_core::random::{uniform, KeyChain};
use mlx_core::{Array, Dtype};

use crate::error::Result;

/// How the drafter picks its tokens.
pub enum DraftSampling<'a> {
    /// argmax of the draft logits.
    Greedy,
    /// Drawn from the processed draft distribution (the same processing as the target's), one
    /// key per drafted position.
    Sample {
        /// The target's sampler settings (temperature and filters).
        cfg: &'a SamplerConfig,
        /// The drafter's key chain; each call to `uniforms` takes the next key.
        keys: &'a mut KeyChain,
    },
}

impl DraftSampling<'_> {
    /// True for `Greedy`.
    pub fn is_greedy(&self) -> bool {
        matches!(self, DraftSampling::Greedy)
    }

    /// Under sampling, draws one token from the processed distribution of `logits` (the
    /// target's filters and temperature) and returns it with that distribution q, which the
    /// verifier must use as is: recomputing q later from the logits would rely on the filters
    /// giving the same bits in another batch shape. The draw is an inverse-CDF draw from q
    /// itself, so q is exactly the distribution the token came from. `logits` // `[1, V]` f32
    /// -> (`[1]` u32, `[1, V]` f32). Greedy drafters pick their own argmax; this returns
    /// `None` for them. Uses one key; a block's drafts are cheaper with [`Self::uniforms`] and
    /// [`Self::draw_with`].
    pub fn draw(&mut self, logits: &Array) -> Result<Option<(Array, Array)>> {
        let Some(u) = self.uniforms(1)? else { return Ok(None) };
        self.draw_with(logits, &u)
    }

    /// Under sampling, `n` independent uniforms in [0, 1) from one key, for the draws of a
    /// block's positions (each key costs a few graph nodes) // `[n]` f32; `None` when greedy.
    pub fn uniforms(&mut self, n: usize) -> Result<Option<Array>> {
        let DraftSampling::Sample { keys, .. } = self else { return Ok(None) };
        Ok(Some(uniform(0.0, 1.0, &[n as i32], Dtype::F32, &keys.next_key()?)?))
    }

    /// [`Self::draw`] with the uniform `u` // `[1]` f32 (one of [`Self::uniforms`]).
    pub fn draw_with(&self, logits: &Array, u: &Array) -> Result<Option<(Array, Array)>> {
        let DraftSampling::Sample { cfg, .. } = self else { return Ok(None) };
        let q = crate::verify::probs::probabilities(logits, cfg)?; // [1, V]
        Ok(Some((crate::verify::probs::sample_rows(&q, u)?, q)))
    }

    /// The draw of block position `k` with its uniform from `block` (what [`Self::uniforms`]
    /// returned for the block); `None` when greedy.
    pub fn draw_at(&self, logits: &Array, block: Option<&Array>, k: usize) -> Result<Option<(Array, Array)>> {
        let Some(u) = block else { return Ok(None) };
        self.draw_with(logits, &u.slice_axis(0, k as i32, k as i32 + 1)?)
    }
}

/// One proposal request.
pub struct DraftRequest<'a> {
    /// The anchor token // `[1]` uint32, on the device.
    pub anchor: &'a Array,
    /// The anchor's absolute position (= committed context length).
    pub position: usize,
    /// Upper bound on the drafts returned (1..=γ).
    pub max_drafts: usize,
    /// Greedy or sampled drafting, matching the target's verify mode.
    pub sampling: DraftSampling<'a>,
    /// The target and its cache as of the committed context (read-only), for drafters that
    /// run the target itself.
    pub target: &'a Model,
    /// The target's cache, read-only, matching `target`.
    pub target_cache: &'a Cache,
}

/// What a drafter proposes.
#[derive(Clone, Debug)]
pub struct Proposal {
    /// Draft tokens // `[d]` uint32
    pub tokens: Array,
    /// The raw logits of each draft position, before any filtering // `[d, V]` f32 (for
    /// diagnostics and quantization checks; verification never reads them).
    pub logits: Option<Array>,
    /// The processed distribution q each draft was drawn from (filters and temperature
    /// applied, as the target's rows are) // `[d, V]` f32. Required under sampling; greedy
    /// drafting leaves it `None`.
    pub q: Option<Array>,
    /// Per-position confidence in (0, 1) // `[d]` f32, if the drafter has a confidence head.
    pub confidence: Option<Array>,
}

impl Proposal {
    /// Number of drafts.
    pub fn len(&self) -> Result<usize> {
        Ok(self.tokens.dim(0)?.max(0) as usize)
    }

    /// True if there are no drafts.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The first `d` drafts (pruning truncates tokens, logits and confidence together).
    pub fn truncate(&self, d: usize) -> Result<Proposal> {
        let d = d as i32;
        Ok(Proposal {
            tokens: self.tokens.slice_axis(0, 0, d)?,
            logits: self.logits.as_ref().map(|l| l.slice_axis(0, 0, d)).transpose()?,
            q: self.q.as_ref().map(|l| l.slice_axis(0, 0, d)).transpose()?,
            confidence: self.confidence.as_ref().map(|c| c.slice_axis(0, 0, d)).transpose()?,
        })
    }
}

/// A speculative-decoding proposer.
pub trait Drafter {
    /// A short name for stats and errors.
    fn name(&self) -> String;
    /// The largest block the drafter can propose (γ).
    fn gamma(&self) -> usize;
    /// The target hidden states the drafter reads, concatenated on features // `[.., m·H]`.
    /// Empty when the drafter reads no target context.
    fn taps(&self) -> TapSet;
    /// True if proposals carry a per-draft confidence (needed for confidence pruning).
    fn has_confidence(&self) -> bool {
        false
    }
    /// The checkpoint's own per-position confidence thresholds, if it has them (DSpark:
    /// calibrated ones; DeepSpec: its `confidence_threshold`).
    fn thresholds(&self) -> Option<Vec<f32>> {
        None
    }
    /// The checkpoint's STS fit for greedy or sampled decoding, if it was calibrated for that
    /// mode (what [`crate::Pruning::Throughput`] turns confidences into survivals with).
    fn sts(&self, greedy: bool) -> Option<crate::calibration::sts::Sts> {
        let _ = greedy;
        None
    }
    /// Starts a request: `ctx` holds the tapped rows of the prompt's committed tokens
    /// // `[1, L, m·H]` (None when `taps()` is empty).
    fn reset(&mut self, ctx: Option<&Array>, len: usize) -> Result<()>;
    /// Committed context rows the drafter holds (must equal the target cache's offset).
    fn context_len(&self) -> usize;
    /// Proposes drafts after the anchor.
    fn propose(&mut self, req: DraftRequest<'_>) -> Result<Proposal>;
    /// Appends the tapped rows of the anchor and the accepted drafts // `[1, k, m·H]`.
    fn commit(&mut self, rows: Option<&Array>, k: usize) -> Result<()>;

    /// A drafter sharing this one's weights, with its own (empty) request state: what an engine
    /// holds per session. `None` where the drafter cannot share (then load another).
    fn fork(&self) -> Option<Box<dyn Drafter>> {
        None
    }

    /// This drafter as a DSpark drafter, whose proposals for several requests can run as one
    /// batched forward ([`crate::dspark::propose_batch`]).
    fn as_dspark(&mut self) -> Option<&mut crate::dspark::DSparkDrafter> {
        None
    }
}
