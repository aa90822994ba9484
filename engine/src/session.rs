//! One request's decoding, advanced a round at a time: prefill (resumed from the prompt cache
//! where that is exact), then speculative rounds ([`spec_decode::SpecRounds`]) or plain decode
//! steps ([`gemma4::generate::Decoder`]), with the text streamed through [`TextStream`].
//!
//! This is the one decoding path of the project's front ends: the server's engine interleaves
//! sessions, and `dspark generate` runs one to the end, so both produce the same text for the
//! same prompt and settings by construction.
//!
//! A session holds only per-request state; the target and the drafter are lent to each call,
//! so an engine can keep one target for many sessions (and, later, verify several sessions'
//! windows in one batched forward).

use std::time::Instant;

use gemma4::generate::{Decoder, GenerateConfig};
use gemma4::tokenizer::Tokenizer;
use gemma4::{Model, TapSet};
use spec_decode::{prefill_from, Drafter, FinishReason, PrefixState, Pruning, SpecConfig, SpecRounds, SpecStats};

use crate::error::{Error, Result};
use crate::prompt_cache::PromptCache;
use crate::text::TextStream;

/// What a request asks of the decoder, in tokens.
#[derive(Clone, Debug)]
pub struct Request {
    /// The prompt's token ids (already templated and encoded for chat), prefilled before the
    /// first round.
    pub prompt: Vec<u32>,
    /// Max tokens, sampler, seed, stop tokens and the prefill chunk.
    pub generate: GenerateConfig,
    /// Stop strings, matched on the decoded text (needs a tokenizer).
    pub stop: Vec<String>,
    /// Drafts per round for speculative decoding (`None`: the drafter's block size).
    pub gamma: Option<usize>,
    /// Confidence pruning of speculative rounds.
    pub pruning: Pruning,
    /// Special tokens whose text the output keeps (chat markup a parser reads, such as
    /// Gemma-4's tool-call markers); other special tokens are left out of the text.
    pub kept_tokens: Vec<u32>,
}

/// What one step emitted.
#[derive(Clone, Debug, Default)]
pub struct StepOut {
    /// Tokens emitted by this step.
    pub tokens: Vec<u32>,
    /// Text released by this step (empty without a tokenizer).
    pub text: String,
    /// Set once the session has ended (a stop string counts as [`FinishReason::Stop`]).
    pub finished: Option<FinishReason>,
}

/// A finished session.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Every token emitted, in order (a stop token ends decoding without being emitted).
    pub tokens: Vec<u32>,
    /// The whole output text, cut before a matched stop string (empty without a tokenizer).
    pub text: String,
    /// Why decoding ended: a stop token or string, or the `max_tokens` limit.
    pub finish: FinishReason,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens whose prefill was taken from the prompt cache.
    pub cached_tokens: usize,
    /// Speculation counters (speculative sessions only).
    pub speculation: Option<SpecStats>,
    /// Wall time of [`Session::start`], in milliseconds: the prompt-cache lookup, the prefill
    /// and readying the first round.
    pub prefill_ms: f64,
    /// Wall time from the end of [`Session::start`] to [`Session::finish`], in milliseconds.
    pub decode_ms: f64,
}

impl Outcome {
    /// Emitted tokens per second of decoding.
    pub fn tok_per_s(&self) -> f64 {
        if self.decode_ms > 0.0 {
            self.tokens.len() as f64 / (self.decode_ms / 1e3)
        } else {
            0.0
        }
    }
}

enum Decoding<'m> {
    Spec(Box<SpecRounds>),
    Plain(Decoder<'m>),
}

/// One request in flight (see the module docs).
pub struct Session<'m, 't> {
    decoding: Decoding<'m>,
    text: Option<TextStream<'t>>,
    stop_tokens: Vec<u32>,
    tokens: Vec<u32>,
    finish: Option<FinishReason>,
    prompt_tokens: usize,
    cached_tokens: usize,
    prefill_ms: f64,
    t_decode: Instant,
}

impl<'m, 't> Session<'m, 't> {
    /// Prefills `req.prompt` (resuming from `cache` where exact, and leaving this prompt's
    /// states there) and readies the first round. With a drafter the session decodes
    /// speculatively and every later [`Session::step`] must lend the same drafter.
    pub fn start(
        target: &'m Model,
        drafter: Option<&mut (dyn Drafter + 'static)>,
        req: &Request,
        tok: Option<&'t Tokenizer>,
        cache: Option<&mut PromptCache>,
    ) -> Result<Session<'m, 't>> {
        let gen = &req.generate;
        gemma4::generate::check_positions(target, req.prompt.len(), gen.max_tokens)?;
        gen.sampler.validate(target.config().vocab_size)?;
        if !req.stop.is_empty() && tok.is_none() {
            return Err(Error::Settings { what: "stop", detail: "stop strings need a tokenizer".into() });
        }
        let taps = drafter.as_ref().map_or_else(|| TapSet::new([]), |d| d.taps());
        let t0 = Instant::now();
        let mut cache = cache;
        let from = cache.as_deref_mut().and_then(|c| c.lookup(&taps, &req.prompt, gen.prefill_step.max(1)));
        let cached_tokens = from.as_ref().map_or(0, |f| f.tokens().len());
        let step = gen.prefill_step.max(1);
        let mut keep: Vec<PrefixState> = Vec::new();
        let head = req.prompt.len().saturating_sub(1);
        let mut pre = prefill_from(target, &taps, &req.prompt, step, from.as_ref(), |s| {
            // The last full chunk's state and the whole head's state (see prompt_cache).
            let n = s.tokens().len();
            if n == head || (n.is_multiple_of(step) && n + step > head) {
                keep.push(s);
            }
        })?;
        if let Some(c) = cache {
            for s in keep {
                c.insert(s);
            }
        }
        let decoding = match drafter {
            Some(d) => {
                let cfg = SpecConfig { generate: gen.clone(), gamma: req.gamma, pruning: req.pruning.clone() };
                let ctx = pre.take_ctx();
                Decoding::Spec(Box::new(SpecRounds::start(target, d, &pre, ctx, &cfg)?))
            }
            None => Decoding::Plain(Decoder::from_prefilled(
                target,
                pre.cache().clone(),
                pre.pending(),
                pre.prompt_tokens(),
                gen,
            )?),
        };
        Ok(Session {
            decoding,
            text: tok.map(|t| TextStream::keeping(t, &req.stop, &req.kept_tokens)),
            stop_tokens: gen.stop_tokens.clone(),
            tokens: Vec::new(),
            finish: None,
            prompt_tokens: req.prompt.len(),
            cached_tokens,
            prefill_ms: t0.elapsed().as_secs_f64() * 1e3,
            t_decode: Instant::now(),
        })
    }

    /// Whether the session has ended.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finish
    }

    /// One speculative round or one plain decode step. `drafter` must be the one the session
    /// started with (none for a plain session).
    pub fn step(&mut self, target: &'m Model, drafter: Option<&mut (dyn Drafter + 'static)>) -> Result<StepOut> {
        if let Some(f) = self.finish {
            return Ok(StepOut { finished: Some(f), ..StepOut::default() });
        }
        let mut new = Vec::new();
        let ended = match (&mut self.decoding, drafter) {
            (Decoding::Spec(r), Some(d)) => r.round(target, d, |t| new.push(t))?,
            (Decoding::Plain(dec), None) => match dec.next_step()? {
                None => Some(FinishReason::Length),
                Some(s) if self.stop_tokens.contains(&s.token) => Some(FinishReason::Stop),
                Some(s) => {
                    new.push(s.token);
                    None
                }
            },
            (Decoding::Spec(_), None) => {
                return Err(Error::Settings {
                    what: "drafter",
                    detail: "a speculative session needs its drafter".into(),
                })
            }
            (Decoding::Plain(_), Some(_)) => {
                return Err(Error::Settings { what: "drafter", detail: "a plain session takes no drafter".into() })
            }
        };
        let mut out = StepOut::default();
        for t in new {
            self.tokens.push(t);
            out.tokens.push(t);
            if let Some(ts) = &mut self.text {
                let p = ts.push(t)?;
                out.text.push_str(&p.text);
                if p.stopped {
                    out.finished = Some(FinishReason::Stop);
                    break;
                }
            }
        }
        if out.finished.is_none() {
            if let Some(f) = ended {
                if let Some(ts) = &mut self.text {
                    out.text.push_str(&ts.flush());
                }
                out.finished = Some(f);
            }
        }
        self.finish = out.finished;
        Ok(out)
    }

    /// Ends the session (early, if it has not finished: then `finish` is `Length`).
    pub fn finish(self) -> Outcome {
        let decode_ms = self.t_decode.elapsed().as_secs_f64() * 1e3;
        let speculation = match self.decoding {
            Decoding::Spec(r) => Some(r.finish().stats),
            Decoding::Plain(_) => None,
        };
        Outcome {
            text: self.text.as_ref().map(|t| t.text().to_string()).unwrap_or_default(),
            tokens: self.tokens,
            finish: self.finish.unwrap_or(FinishReason::Length),
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            speculation,
            prefill_ms: self.prefill_ms,
            decode_ms,
        }
    }

    /// Runs the session to its end, handing each step to `on_step`.
    pub fn run(
        mut self,
        target: &'m Model,
        mut drafter: Option<&mut (dyn Drafter + 'static)>,
        mut on_step: impl FnMut(&StepOut),
    ) -> Result<Outcome> {
        loop {
            let out = self.step(target, drafter.as_deref_mut())?;
            on_step(&out);
            if out.finished.is_some() {
                return Ok(self.finish());
            }
        }
    }
}
