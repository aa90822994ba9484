//! Plain decoding with mlx-lm's `generate_step` call pattern: prefill all but
//! the last prompt token in chunks, run the last token alone, then one token per step; the next
//! step is scheduled before the current token is read back, so the host never idles the device.

use std::time::Instant;

use mlx_core::{async_eval, Array, Dtype};

use crate::cache::Cache;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{biased_logprobs, Sampler, SamplerConfig};

/// Settings of a generation.
#[derive(Clone, Debug)]
pub struct GenerateConfig {
    /// Most tokens to generate (stop token excluded).
    pub max_tokens: usize,
    /// Greedy or sampled decoding, and its filters.
    pub sampler: SamplerConfig,
    /// Seed of the sampler's RNG.
    pub seed: u64,
    /// Prefill chunk size (mlx-lm's `prefill_step_size`, 2048).
    pub prefill_step: usize,
    /// Generation stops after emitting any of these (the token is not returned).
    pub stop_tokens: Vec<u32>,
}

impl Default for GenerateConfig {
    fn default() -> Self {
        GenerateConfig {
            max_tokens: 256,
            sampler: SamplerConfig::default(),
            seed: 0,
            prefill_step: 2048,
            stop_tokens: Vec::new(),
        }
    }
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was produced (or, for a front end matching text, a stop string).
    Stop,
    /// `max_tokens` were produced.
    Length,
}

impl FinishReason {
    /// The name OpenAI's `finish_reason` uses, which the front ends print too.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Timing and counts of one generation.
#[derive(Clone, Debug, Default)]
pub struct GenerateStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated (stop token excluded).
    pub generated_tokens: usize,
    /// Prompt processing through the first generated token.
    pub prefill_ms: f64,
    /// Everything after the first token.
    pub decode_ms: f64,
}

impl GenerateStats {
    /// Tokens per second after the first token.
    pub fn decode_tok_per_s(&self) -> f64 {
        let n = self.generated_tokens.saturating_sub(1) as f64;
        if self.decode_ms > 0.0 {
            n / (self.decode_ms / 1000.0)
        } else {
            0.0
        }
    }

    /// Prompt tokens per second.
    pub fn prefill_tok_per_s(&self) -> f64 {
        if self.prefill_ms > 0.0 {
            self.prompt_tokens as f64 / (self.prefill_ms / 1000.0)
        } else {
            0.0
        }
    }
}

/// Result of `generate`.
#[derive(Clone, Debug)]
pub struct Generation {
    /// Generated token ids, without the prompt or the stop token.
    pub tokens: Vec<u32>,
    /// Why generation ended.
    pub finish: FinishReason,
    /// Timing and counts.
    pub stats: GenerateStats,
}

/// Token ids as a `[1, L]` uint32 array.
pub fn ids_array(ids: &[u32]) -> Result<Array> {
    Ok(Array::from_slice(ids, &[1, ids.len() as i32])?)
}

/// Runs the prompt through the model: chunks of `step` for all but the last token (evaluating
/// the cache after each), then the last token alone. Returns its logits // `[1, V]`
pub fn prefill(model: &Model, cache: &mut Cache, prompt: &[u32], step: usize) -> Result<Array> {
    let Some((&last, head)) = prompt.split_last() else {
        return Err(Error::Input { op: "prefill", detail: "the prompt is empty".into() });
    };
    let vocab = model.config().vocab_size as u32;
    if let Some(bad) = prompt.iter().find(|&&t| t >= vocab) {
        return Err(Error::Input {
            op: "prefill",
            detail: format!("token id {bad} is outside the vocabulary of {vocab}"),
        });
    }
    let step = step.max(1);
    for chunk in head.chunks(step) {
        model.forward(&ids_array(chunk)?, Some(cache))?;
        cache.eval()?;
    }
    step_logits(model, cache, &ids_array(&[last])?)
}

/// One token through the model // token `[1, 1]` -> logits `[1, V]`
pub fn step_logits(model: &Model, cache: &mut Cache, token: &Array) -> Result<Array> {
    let hidden = model.forward(token, Some(cache))?;
    let l = hidden.dim(1)?;
    let last = hidden.slice_axis(1, l - 1, l)?.squeeze(1)?; // [1, H]
    model.logits_from_hidden(&last)
}

/// One decoded token and the logprobs it was drawn from.
#[derive(Clone, Debug)]
pub struct Step {
    /// The token id.
    pub token: u32,
    /// The (unfiltered) logprobs of this step, `logit_bias` applied // `[1, V]`
    pub logprobs: Array,
}

/// A token-at-a-time decoder with mlx-lm's pipelining: when a token is returned, the step that
/// produces the next one is already scheduled on the device.
pub struct Decoder<'m> {
    model: &'m Model,
    cache: Cache,
    sampler: Sampler,
    pending: Option<(Array, Array)>, // (token [1], logprobs [1, V]), scheduled
    remaining: usize,
}

impl<'m> Decoder<'m> {
    /// Prefills `prompt` and schedules the first token; at most `max_tokens` will be produced.
    /// Refused up front when the prompt plus `max_tokens` would pass the model's
    /// `max_position_embeddings`.
    pub fn new(model: &'m Model, prompt: &[u32], cfg: &GenerateConfig) -> Result<Decoder<'m>> {
        check_positions(model, prompt.len(), cfg.max_tokens)?;
        cfg.sampler.validate(model.config().vocab_size)?;
        let mut sampler = Sampler::new(cfg.sampler.clone(), cfg.seed)?;
        let mut cache = model.new_cache();
        let mut pending = None;
        if cfg.max_tokens > 0 {
            let logits = prefill(model, &mut cache, prompt, cfg.prefill_step)?;
            model.check_first_logits(&logits)?;
            let lp = biased_logprobs(&logits, &cfg.sampler)?;
            let y = sampler.sample(&lp)?;
            async_eval(&[&y, &lp])?;
            pending = Some((y, lp));
        }
        Ok(Decoder { model, cache, sampler, pending, remaining: cfg.max_tokens })
    }

    /// A decoder for a prompt whose tokens but the last (`last`) are already in `cache`, run
    /// through the model in chunks exactly as [`prefill`] runs them (a prompt cache resumes
    /// here); then the same steps as [`Decoder::new`]. `prompt_tokens` counts the whole prompt.
    pub fn from_prefilled(
        model: &'m Model,
        mut cache: Cache,
        last: u32,
        prompt_tokens: usize,
        cfg: &GenerateConfig,
    ) -> Result<Decoder<'m>> {
        check_positions(model, prompt_tokens, cfg.max_tokens)?;
        cfg.sampler.validate(model.config().vocab_size)?;
        if cache.offset() + 1 != prompt_tokens {
            return Err(Error::Input {
                op: "decode",
                detail: format!("the cache holds {} tokens of a {prompt_tokens}-token prompt", cache.offset()),
            });
        }
        let mut sampler = Sampler::new(cfg.sampler.clone(), cfg.seed)?;
        let mut pending = None;
        if cfg.max_tokens > 0 {
            let logits = step_logits(model, &mut cache, &ids_array(&[last])?)?;
            model.check_first_logits(&logits)?;
            let lp = biased_logprobs(&logits, &cfg.sampler)?;
            let y = sampler.sample(&lp)?;
            async_eval(&[&y, &lp])?;
            pending = Some((y, lp));
        }
        Ok(Decoder { model, cache, sampler, pending, remaining: cfg.max_tokens })
    }

    /// The next token, or None once `max_tokens` were produced.
    pub fn next_step(&mut self) -> Result<Option<Step>> {
        let Some((y, lp)) = self.pending.take() else { return Ok(None) };
        self.remaining -= 1;
        if self.remaining > 0 {
            // Schedule the next step before reading this token back.
            let logits = step_logits(self.model, &mut self.cache, &y.reshape(&[1, 1])?)?;
            let nlp = biased_logprobs(&logits, self.sampler.config())?;
            let n = self.sampler.sample(&nlp)?;
            async_eval(&[&n, &nlp])?;
            self.pending = Some((n, nlp));
        }
        let token = y.astype(Dtype::U32)?.item::<u32>()?;
        Ok(Some(Step { token, logprobs: lp }))
    }

    /// The cache (tokens written so far).
    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

/// Refuses a generation whose prompt plus `max_tokens` exceeds the positions the model was
/// trained for: past them RoPE angles were never seen, and the output silently degrades.
pub fn check_positions(model: &Model, prompt_tokens: usize, max_tokens: usize) -> Result<()> {
    let limit = model.config().max_position_embeddings;
    let total = prompt_tokens.saturating_add(max_tokens);
    if total > limit {
        return Err(Error::Input {
            op: "generate",
            detail: format!(
                "the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is {total} positions, more than the model's max_position_embeddings ({limit})"
            ),
        });
    }
    Ok(())
}

/// Generates from `prompt`, calling `on_token` with each token as soon as it is known.
///
/// ```no_run
/// use gemma4::generate::{generate, GenerateConfig};
/// let model = gemma4::Model::load(std::path::Path::new("gemma-4-e2b-it"))?;
/// let cfg = GenerateConfig { max_tokens: 64, stop_tokens: model.config().eos_token_ids.clone(), ..Default::default() };
/// let out = generate(&model, &[2, 651, 6037], &cfg, |t| print!("{t} "))?;
/// println!("\n{} tokens at {:.1} tok/s", out.tokens.len(), out.stats.decode_tok_per_s());
/// # Ok::<(), gemma4::Error>(())
/// ```
pub fn generate(
    model: &Model,
    prompt: &[u32],
    cfg: &GenerateConfig,
    mut on_token: impl FnMut(u32),
) -> Result<Generation> {
    let mut stats = GenerateStats { prompt_tokens: prompt.len(), ..Default::default() };
    let t0 = Instant::now();
    let mut dec = Decoder::new(model, prompt, cfg)?;
    let mut tokens = Vec::new();
    let mut t_first = None;
    let finish = loop {
        let Some(step) = dec.next_step()? else { break FinishReason::Length };
        if t_first.is_none() {
            t_first = Some(Instant::now());
            stats.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        }
        if cfg.stop_tokens.contains(&step.token) {
            break FinishReason::Stop;
        }
        tokens.push(step.token);
        on_token(step.token);
    };
    if let Some(t) = t_first {
        stats.decode_ms = t.elapsed().as_secs_f64() * 1e3;
    }
    stats.generated_tokens = tokens.len();
    Ok(Generation { tokens, finish, stats })
}
