//! A drafter that proposes the target's own continuation, by running the target on a copy of its
//! cache (arrays are shared, so the copy is free until written). Acceptances are then near
//! certain, which makes it the non-vacuous drafter for the lossless gates; it is slow (d target
//! forwards per round) and not meant for production.

use gemma4::TapSet;
use mlx_core::{concatenate, Array, Dtype};

use crate::drafter::{DraftRequest, Drafter, Proposal};
use crate::error::Result;

/// The target drafting for itself.
pub struct SelfDrafter {
    gamma: usize,
    ctx_len: usize,
}

impl SelfDrafter {
    /// Proposes up to `gamma` tokens per round.
    pub fn new(gamma: usize) -> SelfDrafter {
        SelfDrafter { gamma, ctx_len: 0 }
    }
}

impl Drafter for SelfDrafter {
    fn name(&self) -> String {
        "self (target continuation)".into()
    }

    fn gamma(&self) -> usize {
        self.gamma
    }

    fn taps(&self) -> TapSet {
        TapSet::default()
    }

    fn reset(&mut self, _ctx: Option<&Array>, len: usize) -> Result<()> {
        self.ctx_len = len;
        Ok(())
    }

    fn context_len(&self) -> usize {
        self.ctx_len
    }

    fn propose(&mut self, req: DraftRequest<'_>) -> Result<Proposal> {
        let mut cache = req.target_cache.clone();
        let mut tok = req.anchor.reshape(&[1, 1])?;
        let mut sampling = req.sampling;
        let (mut tokens, mut logits, mut qs) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..req.max_drafts.min(self.gamma) {
            // Stepwise, like the verify, so the proposals are exactly plain greedy's tokens.
            let h = req.target.forward_stepwise(&tok, &mut cache, None)?.hidden.squeeze(1)?; // [1, H]
            let l = req.target.logits_from_hidden(&h)?; // [1, V]

            // Greedy picks as plain decoding does, from the target-dtype logprobs; sampling draws
            // from the f32 logits (drawing from bf16 logits would bias q).
            let lf = l.astype(Dtype::F32)?;
            let t = match sampling.draw(&lf)? {
                Some((t, q)) => {
                    qs.push(q);
                    t
                }
                None => gemma4::sampling::logprobs(&l)?.argmax(-1, false)?.astype(Dtype::U32)?,
            };
            logits.push(lf);
            tok = t.reshape(&[1, 1])?;
            tokens.push(t);
        }
        let q = if qs.is_empty() { None } else { Some(concatenate(&qs, 0)?) };
        Ok(Proposal { tokens: concatenate(&tokens, 0)?, logits: Some(concatenate(&logits, 0)?), q, confidence: None })
    }

    fn commit(&mut self, _rows: Option<&Array>, k: usize) -> Result<()> {
        self.ctx_len += k;
        Ok(())
    }
}
