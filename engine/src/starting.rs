//! A request being admitted: its prompt prefilled a chunk at a time, so an engine interleaves
//! a long prompt with the decode steps of the sessions already running instead of stalling them
//! for the whole prefill.
//!
//! The chunks are the prefill grid's (`prefill_step`), resumed from the state after the last
//! one ([`spec_decode::prefill_from`]'s rule), so a prompt prefilled over many engine iterations
//! gets the bits of one prefilled at once, and the prompt cache's states stay on the grid.

use std::time::Instant;

use gemma4::tokenizer::Tokenizer;
use gemma4::{Model, TapSet};
use spec_decode::{prefill_from, Drafter, PrefixState};

use crate::error::{Error, Result};
use crate::prompt_cache::PromptCache;
use crate::session::{Request, Session};

/// A request whose prompt is being prefilled (see the module docs).
pub struct Starting<'t> {
    req: Request,
    tok: Option<&'t Tokenizer>,
    taps: TapSet,
    /// The prefill so far (`None`: nothing run and nothing cached).
    state: Option<PrefixState>,
    cached_tokens: usize,
    /// States the prompt cache keeps: the last full chunk's and the whole head's.
    keep: Vec<PrefixState>,
    t0: Instant,
    /// Milliseconds spent prefilling, over every chunk.
    prefill_ms: f64,
}

impl<'t> Starting<'t> {
    /// Checks the request and resumes from the longest exact prefix in `cache`. `taps`: the
    /// drafter's (empty for plain decoding).
    pub fn new(
        target: &Model,
        taps: TapSet,
        req: &Request,
        tok: Option<&'t Tokenizer>,
        cache: Option<&mut PromptCache>,
    ) -> Result<Starting<'t>> {
        let gen = &req.generate;
        gemma4::generate::check_positions(target, req.prompt.len(), gen.max_tokens)?;
        gen.sampler.validate(target.config().vocab_size)?;
        if !req.stop.is_empty() && tok.is_none() {
            return Err(Error::Settings { what: "stop", detail: "stop strings need a tokenizer".into() });
        }
        if req.prompt.is_empty() {
            return Err(Error::Settings { what: "prompt", detail: "the prompt is empty".into() });
        }
        let t0 = Instant::now();
        let state = cache.and_then(|c| c.lookup(&taps, &req.prompt, gen.prefill_step.max(1)));
        let cached_tokens = state.as_ref().map_or(0, |f| f.tokens().len());
        Ok(Starting { req: req.clone(), tok, taps, state, cached_tokens, keep: Vec::new(), t0, prefill_ms: 0.0 })
    }

    /// Runs the next chunk of the prefill grid; returns whether the prompt is prefilled.
    pub fn advance(&mut self, target: &Model) -> Result<bool> {
        let step = self.req.generate.prefill_step.max(1);
        let head = self.req.prompt.len() - 1;
        let done = self.state.as_ref().map_or(0, |s| s.tokens().len());
        if done >= head {
            return Ok(true);
        }
        // Up to the next grid boundary: the prefix `prompt[..=end]` has head `prompt[..end]`.
        let end = ((done / step + 1) * step).min(head);
        let t = Instant::now();
        let mut last = None;
        prefill_from(target, &self.taps, &self.req.prompt[..=end], step, self.state.as_ref(), |s| last = Some(s))?;
        let s = last.ok_or_else(|| Error::Batch("a prefill chunk left no state".into()))?;
        let n = s.tokens().len();
        if n == head || (n.is_multiple_of(step) && n + step > head) {
            self.keep.push(s.clone());
        }
        self.state = Some(s);
        self.prefill_ms += t.elapsed().as_secs_f64() * 1e3;
        Ok(n >= head)
    }

    /// The session, once [`Self::advance`] says the prompt is prefilled (it runs what is left
    /// otherwise); leaves the kept prefix states in `cache`. With a drafter the session
    /// decodes speculatively, and every later step must lend the same drafter.
    pub fn finish<'m>(
        mut self,
        target: &'m Model,
        drafter: Option<&mut (dyn Drafter + 'static)>,
        cache: Option<&mut PromptCache>,
    ) -> Result<Session<'m, 't>> {
        while !self.advance(target)? {}
        let step = self.req.generate.prefill_step.max(1);
        let pre = prefill_from(target, &self.taps, &self.req.prompt, step, self.state.as_ref(), |_| {})?
            .with_ms(self.prefill_ms);
        if let Some(c) = cache {
            for s in self.keep.drain(..) {
                c.insert(s);
            }
        }
        Session::from_prefilled(target, drafter, &self.req, self.tok, pre, self.cached_tokens, self.t0)
    }
}
