//! One plain (non-speculative) request between batched steps: its cache, its sampler and the
//! pending token, which the next step scores as the request's one row of the batch. It decodes
//! what `gemma4::generate::Decoder` decodes: the same row bits (a stepwise row is a one-token
//! decode step), the same logit bias, sampler and key chain, the same stop and length rules.

use gemma4::generate::FinishReason;
use gemma4::sampling::{biased_logprobs, Sampler};
use gemma4::{Cache, Model};
use mlx_core::{Array, Dtype};

use crate::error::Result;

/// A plain request's state (see the module docs).
pub struct PlainRounds {
    cache: Cache,
    sampler: Sampler,
    pending: u32,
    emitted: usize,
    /// The request's settings: max tokens and stop tokens, and for [`Self::unstarted`].
    cfg: gemma4::generate::GenerateConfig,
    /// The next token drawn for the batch's one evaluation: lazily ([`Self::draw`]), or read
    /// from the batch's greedy draw of all rows ([`Self::drawn_greedy`]).
    drawn: Option<Drawn>,
}

enum Drawn {
    Lazy(Array),
    Read(u32),
}

impl PlainRounds {
    /// A request whose prompt but its last token (`pending`) is in `cache`.
    pub fn new(cache: Cache, pending: u32, cfg: &gemma4::generate::GenerateConfig) -> Result<PlainRounds> {
        Ok(PlainRounds {
            cache,
            sampler: Sampler::new(cfg.sampler.clone(), cfg.seed)?,
            pending,
            emitted: 0,
            cfg: cfg.clone(),
            drawn: None,
        })
    }

    /// Before its first step: the cache, the pending token and the request's settings (to decode
    /// it with `gemma4`'s pipelined decoder instead); `None` once a step has run.
    pub fn unstarted(&self) -> Option<(Cache, u32, gemma4::generate::GenerateConfig)> {
        (self.emitted == 0 && self.drawn.is_none()).then(|| (self.cache.clone(), self.pending, self.cfg.clone()))
    }

    /// Whether the request has produced `max_tokens` tokens.
    pub fn at_length(&self) -> bool {
        self.emitted >= self.cfg.max_tokens
    }

    /// The row this step scores: the pending token // `[1]`
    pub fn window(&self) -> Result<Array> {
        Ok(Array::from_slice(&[self.pending], &[1])?)
    }

    /// The target cache the step extends.
    pub fn cache_mut(&mut self) -> &mut Cache {
        &mut self.cache
    }

    /// The next token drawn from the step's logits `[1, V]`, not evaluated // `[1]` uint32: a
    /// batch evaluates every session's draw with its forward, in one pass, and
    /// [`Self::conclude`] reads it.
    pub fn draw(&mut self, target: &Model, logits: &Array) -> Result<Array> {
        target.check_first_logits(logits)?;
        let lp = biased_logprobs(logits, self.sampler.config())?;
        let token = self.sampler.sample(&lp)?.astype(Dtype::U32)?;
        self.drawn = Some(Drawn::Lazy(token.clone()));
        Ok(token)
    }

    /// Whether the next token is the argmax of the row's log-probabilities, unbiased: what
    /// [`greedy_tokens`] draws for many rows at once.
    pub fn greedy(&self) -> bool {
        self.sampler.config().is_greedy() && self.sampler.config().logit_bias.is_empty()
    }

    /// The next token, drawn by the batch for a [`Self::greedy`] request (instead of
    /// [`Self::draw`]).
    pub fn drawn_greedy(&mut self, token: u32) {
        self.drawn = Some(Drawn::Read(token));
    }

    /// Reads the token drawn from the step's logits `[1, V]` (drawing it now unless
    /// [`Self::draw`] did; one host read); returns it, or why the request ended (a stop token is
    /// not emitted).
    pub fn conclude(&mut self, target: &Model, logits: &Array) -> Result<(Option<u32>, Option<FinishReason>)> {
        let token = match self.drawn.take() {
            Some(Drawn::Read(t)) => t,
            Some(Drawn::Lazy(t)) => t.item::<u32>()?,
            None => self.draw(target, logits)?.item::<u32>()?,
        };
        if self.cfg.stop_tokens.contains(&token) {
            return Ok((None, Some(FinishReason::Stop)));
        }
        self.emitted += 1;
        self.pending = token;
        Ok((Some(token), self.at_length().then_some(FinishReason::Length)))
    }
}

/// The greedy token of every row of `logits` `[R, V]` in one pass // `[R]` uint32: the argmax
/// of each row's log-probabilities, which is [`PlainRounds::draw`]'s for a [`PlainRounds::greedy`]
/// request when the rows' log-softmax is the row kernel (each row's bits its own, whatever
/// the other rows); None where it is not, and requests then draw alone.
pub fn greedy_tokens(logits: &Array) -> Result<Option<Array>> {
    if !mlx_core::blas::row_kernels_for(logits)? {
        return Ok(None);
    }
    Ok(Some(gemma4::sampling::logprobs(logits)?.argmax(-1, false)?.astype(Dtype::U32)?))
}
