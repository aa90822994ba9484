//! One request's decoding, advanced a step at a time: prefill (resumed from the prompt cache
//! where that is exact), then speculative rounds ([`spec_decode::SpecRounds`]) or plain decode
//! steps ([`PlainRounds`]), with the text streamed through [`TextStream`].
//!
//! A step is split where a batch joins it: [`Session::prepare`] and the drafts (for a
//! speculative session; several sessions' in one drafter forward), [`Session::keep`] (the window the batch schedule chose), one target forward over
//! every session's window ([`crate::batch`]), and [`Session::conclude`] (verdict, emit, commit).
//! [`Session::step`] is that sequence for a session alone. This is the one decoding path of the
//! project's front ends: the server's engine steps its sessions together, and `dspark generate`
//! steps one to the end, so both produce the same text for the same prompt and settings.
//!
//! A session holds only per-request state; the target and the drafter are lent to each call,
//! so an engine keeps one target for many sessions.

use std::time::Instant;

use gemma4::generate::GenerateConfig;
use gemma4::tokenizer::Tokenizer;
use gemma4::{Model, TapSet};
use mlx_core::Array;
use spec_decode::{
    DraftRequest, Drafter, Drafting, FinishReason, Proposed, Pruning, SpecConfig, SpecRounds, SpecStats, Window,
};

use crate::error::{Error, Result};
use crate::plain::PlainRounds;
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
    /// The client chose the seed: a sampled request must then be the same sample whatever else
    /// is batched with it, so its windows are its own rule's, not the batch schedule's (greedy
    /// output is the same either way).
    pub seeded: bool,
    /// The `auto` schedule's choice: where drafting has not paid, the engine may take plain
    /// steps instead (greedy, or unseeded sampled requests; see [`crate::batch_schedule`]).
    /// `false` drafts every step (`--schedule full`, manual pruning).
    pub adaptive: bool,
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

enum Decoding {
    Spec(Box<SpecRounds>),
    Plain(Box<PlainRounds>),
}

/// What a step does ([`Session::prepare`]).
pub enum Prepared {
    /// Nothing: the session has ended.
    Ended,
    /// A plain decode step.
    Plain,
    /// A speculative round, which drafts first.
    Draft(Drafting),
}

fn missing_drafter() -> Error {
    Error::Settings { what: "drafter", detail: "a speculative session needs its drafter".into() }
}

/// A step's drafts, before its window is chosen ([`Session::proposed`]).
pub enum Proposal {
    /// A speculative round's drafts, before the window is chosen.
    Spec(Proposed),
    /// A plain decode step.
    Plain,
}

impl Proposal {
    /// The drafts' arrays not yet evaluated (see [`Proposed::pending`]).
    pub fn pending(&self) -> Vec<&Array> {
        match self {
            Proposal::Spec(p) => p.pending(),
            Proposal::Plain => Vec::new(),
        }
    }
}

/// A step's rows, ready for the batched forward ([`Session::keep`]).
pub enum Rows {
    /// A speculative round's verify window.
    Spec(Window),
    /// A plain step's one row // `[1]`
    Plain(Array),
}

impl Rows {
    /// The tokens scored // `[L]` uint32
    pub fn tokens(&self) -> &Array {
        match self {
            Rows::Spec(w) => &w.tokens,
            Rows::Plain(a) => a,
        }
    }

    /// L, the rows this step adds to the batch.
    pub fn len(&self) -> usize {
        match self {
            Rows::Spec(w) => w.drafts + 1,
            Rows::Plain(_) => 1,
        }
    }

    /// Never: a step scores at least its pending token.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// One request in flight (see the module docs).
pub struct Session<'m, 't> {
    target: &'m Model,
    decoding: Decoding,
    seeded: bool,
    adaptive: bool,
    /// Steps since the session last drafted (a batch schedule may hold its drafts back).
    idle: usize,
    /// The schedule of steps taken alone ([`Session::step`]), kept across them.
    schedule: crate::batch::BatchSchedule,
    text: Option<TextStream<'t>>,
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
        mut cache: Option<&mut PromptCache>,
    ) -> Result<Session<'m, 't>> {
        let taps = drafter.as_ref().map_or_else(|| TapSet::new([]), |d| d.taps());
        crate::starting::Starting::new(target, taps, req, tok, cache.as_deref_mut())?.finish(target, drafter, cache)
    }

    /// A session from a finished prefill (see [`crate::starting::Starting`]).
    pub(crate) fn from_prefilled(
        target: &'m Model,
        drafter: Option<&mut (dyn Drafter + 'static)>,
        req: &Request,
        tok: Option<&'t Tokenizer>,
        mut pre: spec_decode::Prefilled,
        cached_tokens: usize,
        t0: Instant,
    ) -> Result<Session<'m, 't>> {
        let gen = &req.generate;
        let decoding = match drafter {
            Some(d) => {
                let cfg = SpecConfig { generate: gen.clone(), gamma: req.gamma, pruning: req.pruning.clone() };
                let ctx = pre.take_ctx();
                Decoding::Spec(Box::new(SpecRounds::start(target, d, &pre, ctx, &cfg)?))
            }
            None => Decoding::Plain(Box::new(PlainRounds::new(pre.cache().clone(), pre.pending(), gen)?)),
        };
        Ok(Session {
            target,
            decoding,
            seeded: req.seeded,
            adaptive: req.adaptive,
            idle: 0,
            schedule: crate::batch::BatchSchedule::default(),
            text: tok.map(|t| TextStream::keeping(t, &req.stop, &req.kept_tokens)),
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

    /// The drafts `drafter` proposes alone for a prepared step (`d` from [`Self::prepare`]);
    /// a batch drafts for several sessions at once with [`Self::draft_request`] and
    /// [`Self::proposed`] instead.
    pub fn draft_alone(&mut self, d: Drafting, drafter: &mut dyn Drafter) -> Result<Proposal> {
        let target = self.target;
        match &mut self.decoding {
            Decoding::Spec(r) => Ok(Proposal::Spec(r.draft(target, drafter, d)?)),
            Decoding::Plain(_) => Ok(Proposal::Plain),
        }
    }

    /// Before a step's drafts: whether the session has ended, takes a plain step, or drafts
    /// (with how many drafts it may propose: at most `cap` when given).
    pub fn prepare(&mut self, drafter: Option<&(dyn Drafter + 'static)>, cap: Option<usize>) -> Result<Prepared> {
        let p = match (&mut self.decoding, drafter) {
            _ if self.finish.is_some() => Prepared::Ended,
            (Decoding::Spec(r), Some(d)) => match r.prepare(d, cap)? {
                Some(d) => Prepared::Draft(d),
                None => Prepared::Ended,
            },
            (Decoding::Spec(_), None) => return Err(missing_drafter()),
            (Decoding::Plain(_), Some(_)) => {
                return Err(Error::Settings { what: "drafter", detail: "a plain session takes no drafter".into() })
            }
            (Decoding::Plain(p), None) if p.at_length() => Prepared::Ended,
            (Decoding::Plain(_), None) => Prepared::Plain,
        };
        self.idle = match &p {
            Prepared::Draft(d) if d.max_drafts > 0 => 0,
            _ => self.idle + 1,
        };
        if matches!(p, Prepared::Ended) && self.finish.is_none() {
            self.finish = Some(FinishReason::Length);
        }
        Ok(p)
    }

    /// What this session asks of its drafter (speculative sessions only).
    pub fn draft_request<'a>(&'a mut self, d: &'a Drafting) -> Option<DraftRequest<'a>> {
        let target = self.target;
        match &mut self.decoding {
            Decoding::Spec(r) => Some(r.draft_request(target, d)),
            Decoding::Plain(_) => None,
        }
    }

    /// The step's proposal from the drafts `p` (none: a plain step) its drafter (`drafter`,
    /// named in errors) returned for `d`.
    pub fn proposed(&mut self, d: Drafting, p: Option<spec_decode::Proposal>, drafter: &str) -> Result<Proposal> {
        match &mut self.decoding {
            Decoding::Spec(r) => Ok(Proposal::Spec(r.proposed(d, p, drafter)?)),
            Decoding::Plain(_) => Ok(Proposal::Plain),
        }
    }

    /// Reads what the proposal's window depends on (the drafts' confidences, when the session
    /// prunes); evaluate [`Proposal::pending`] of every session first to do it in one pass.
    pub fn read(&mut self, p: &mut Proposal) -> Result<()> {
        match (&mut self.decoding, p) {
            (Decoding::Spec(r), Proposal::Spec(p)) => Ok(r.read_confidences(p)?),
            _ => Ok(()),
        }
    }

    /// Whether a batch schedule may choose this session's windows and whether it drafts: it
    /// runs the throughput schedule, and its output is not a seeded sample (see
    /// [`Request::seeded`]).
    pub fn batch_scheduled(&self) -> bool {
        match &self.decoding {
            Decoding::Spec(r) => (r.throughput_scheduled() || self.adaptive) && (r.is_greedy() || !self.seeded),
            Decoding::Plain(_) => false,
        }
    }

    /// Whether the session may take plain steps where drafting has not paid
    /// ([`Request::adaptive`]).
    pub fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// Steps since the session last drafted.
    pub fn idle(&self) -> usize {
        self.idle
    }

    /// Drafts the next round is expected to get accepted if it drafts a whole block: the sum
    /// over block positions of the share of rounds that verified the position and accepted it
    /// (each with one prior round accepting position i with probability 2^-(i+1), so a new
    /// session starts near one). A whole block's expected run is the sum of its positions'
    /// acceptance; per position, rounds whose window a busy batch cut short before it do not
    /// count against it.
    pub fn expected_accepted(&self) -> f64 {
        match &self.decoding {
            Decoding::Spec(r) => {
                let st = r.stats();
                (0..r.gamma())
                    .map(|i| {
                        let acc = st.accepted_by_pos.get(i).copied().unwrap_or(0) as f64;
                        let ver = st.drafted_by_pos.get(i).copied().unwrap_or(0) as f64;
                        (acc + 0.5f64.powi(i as i32 + 1)) / (ver + 1.0)
                    })
                    .sum()
            }
            Decoding::Plain(_) => 0.0,
        }
    }

    /// Calibrated survivals of the proposed drafts, when a batch schedule may choose this
    /// session's window: it runs the throughput schedule, and its output is not a seeded sample
    /// (see [`Request::seeded`]).
    pub fn offer(&self, p: &Proposal) -> Option<Vec<f32>> {
        match (&self.decoding, p) {
            (Decoding::Spec(r), Proposal::Spec(p)) if self.batch_scheduled() => r.survivals(p),
            _ => None,
        }
    }

    /// The window the session's own rule keeps (its cut, or the whole block; 0 for plain).
    pub fn own_window(&self, p: &Proposal) -> usize {
        match (&self.decoding, p) {
            (Decoding::Spec(r), Proposal::Spec(p)) => r.own_window(p),
            _ => 0,
        }
    }

    /// The step's rows, keeping the first `drafts` of the proposal.
    pub fn keep(&mut self, p: Proposal, drafts: usize) -> Result<Rows> {
        match (&mut self.decoding, p) {
            (Decoding::Spec(r), Proposal::Spec(p)) => Ok(Rows::Spec(r.keep(p, drafts)?)),
            (Decoding::Plain(p), Proposal::Plain) => Ok(Rows::Plain(p.window()?)),
            _ => Err(Error::Settings { what: "proposal", detail: "the proposal is another kind of session's".into() }),
        }
    }

    /// The target cache the step's rows extend.
    pub fn cache_mut(&mut self) -> &mut gemma4::Cache {
        match &mut self.decoding {
            Decoding::Spec(r) => r.cache_mut(),
            Decoding::Plain(p) => p.cache_mut(),
        }
    }

    /// The taps the forward must return for this session's drafter (empty for plain).
    pub fn taps(&self) -> TapSet {
        match &self.decoding {
            Decoding::Spec(r) => r.taps().clone(),
            Decoding::Plain(_) => TapSet::new([]),
        }
    }

    /// Whether this step's token is a plain greedy draw the batch makes for many sessions at
    /// once ([`crate::plain::greedy_tokens`]), handed over with [`Self::drawn_greedy`].
    pub fn draws_greedy(&self, rows: &Rows) -> bool {
        matches!((&self.decoding, rows), (Decoding::Plain(p), Rows::Plain(_)) if p.greedy())
    }

    /// The token the batch drew for a [`Self::draws_greedy`] step.
    pub fn drawn_greedy(&mut self, token: u32) {
        if let Decoding::Plain(p) = &mut self.decoding {
            p.drawn_greedy(token);
        }
    }

    /// A plain step's next token, drawn from its `logits` // `[1, V]` without evaluating it (a
    /// batch evaluates the draws with the forward, one pass for all); `None` for a speculative
    /// round, whose verdict reads its logits in [`Self::conclude`].
    pub fn draw(&mut self, rows: &Rows, logits: &Array) -> Result<Option<Array>> {
        match (&mut self.decoding, rows) {
            (Decoding::Plain(p), Rows::Plain(_)) => Ok(Some(p.draw(self.target, logits)?)),
            _ => Ok(None),
        }
    }

    /// A step's last half, given the forward's rows for `rows`: `logits` // `[L, V]`, `taps`
    /// // `[1, L, m·H]` when the drafter taps. Emits, streams the text, commits.
    pub fn conclude(
        &mut self,
        drafter: Option<&mut (dyn Drafter + 'static)>,
        rows: Rows,
        logits: &Array,
        taps: Option<&Array>,
    ) -> Result<StepOut> {
        let mut new = Vec::new();
        let ended = match (&mut self.decoding, drafter, rows) {
            (Decoding::Spec(r), Some(d), Rows::Spec(w)) => {
                self.target.check_first_logits(logits)?;
                r.conclude(d, w, logits, taps, &mut |t| new.push(t))?
            }
            (Decoding::Plain(p), None, Rows::Plain(_)) => {
                let (token, ended) = p.conclude(self.target, logits)?;
                new.extend(token);
                ended
            }
            _ => return Err(Error::Settings { what: "rows", detail: "the rows are another kind of session's".into() }),
        };
        self.emit(new, ended)
    }

    /// A step's output from the tokens it produced (`new`) and why the request ended after them
    /// (`ended`): streams the text, applies the stop strings, records the finish.
    fn emit(&mut self, new: Vec<u32>, ended: Option<FinishReason>) -> Result<StepOut> {
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

    /// The output of a step that found the session ended ([`Self::prepare`] said so).
    pub fn ended(&mut self) -> StepOut {
        let mut out = StepOut { finished: self.finish, ..StepOut::default() };
        if let Some(ts) = &mut self.text {
            out.text = ts.flush();
        }
        out
    }

    /// One speculative round or one plain decode step, alone (a batch of one: see
    /// [`crate::batch`]). `drafter` must be the one the session started with (none for a plain
    /// session).
    pub fn step(&mut self, drafter: Option<&mut (dyn Drafter + 'static)>) -> Result<StepOut> {
        let target = self.target;
        // The session's own schedule, kept across its steps: alone, it drafts while drafting
        // has paid (see crate::batch_schedule).
        let mut schedule = std::mem::take(&mut self.schedule);
        let mut one = [crate::batch::Member { session: self, drafter }];
        let mut outs = crate::batch::step(target, &mut one, &mut schedule);
        self.schedule = schedule;
        outs.pop().unwrap_or_else(|| Err(Error::Batch("a batch of one gave no output".into())))
    }

    /// A plain session alone, not yet stepped, as `gemma4`'s pipelined decoder (it builds step
    /// n + 1's graph while step n runs, as `generate` does; a batched step cannot, its rows
    /// depend on every session's last read). The same rows, sampler and key chain, so the same
    /// tokens. `None` for a speculative session or one already stepped.
    fn pipelined(&mut self) -> Result<Option<(gemma4::generate::Decoder<'m>, GenerateConfig)>> {
        let Decoding::Plain(p) = &self.decoding else { return Ok(None) };
        let Some((cache, last, cfg)) = p.unstarted() else { return Ok(None) };
        if cfg.max_tokens == 0 || !self.tokens.is_empty() || self.finish.is_some() {
            return Ok(None);
        }
        let dec = gemma4::generate::Decoder::from_prefilled(self.target, cache, last, self.prompt_tokens, &cfg)?;
        Ok(Some((dec, cfg)))
    }

    /// [`Self::run`] through the pipelined decoder: a step per token, as the batched path emits
    /// them (a stop token ends the request unemitted; the last of `max_tokens` ends it).
    fn run_pipelined(
        mut self,
        (mut dec, cfg): (gemma4::generate::Decoder<'m>, GenerateConfig),
        mut on_step: impl FnMut(&StepOut),
    ) -> Result<Outcome> {
        let mut produced = 0usize;
        loop {
            let (new, ended) = match dec.next_step()? {
                None => (Vec::new(), Some(FinishReason::Length)),
                Some(step) if cfg.stop_tokens.contains(&step.token) => (Vec::new(), Some(FinishReason::Stop)),
                Some(step) => {
                    produced += 1;
                    (vec![step.token], (produced >= cfg.max_tokens).then_some(FinishReason::Length))
                }
            };
            let out = self.emit(new, ended)?;
            on_step(&out);
            if out.finished.is_some() {
                return Ok(self.finish());
            }
        }
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
        mut drafter: Option<&mut (dyn Drafter + 'static)>,
        mut on_step: impl FnMut(&StepOut),
    ) -> Result<Outcome> {
        if drafter.is_none() {
            if let Some(dec) = self.pipelined()? {
                return self.run_pipelined(dec, on_step);
            }
        }
        loop {
            let out = self.step(drafter.as_deref_mut())?;
            on_step(&out);
            if out.finished.is_some() {
                return Ok(self.finish());
            }
        }
    }
}
