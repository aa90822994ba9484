//! Token selection as mlx-lm's `make_sampler` applies it: greedy is the argmax
//! of bf16 **logprobs** (not logits); otherwise top-p, min-p, top-k filter the T = 1
//! logprobs in that order, and temperature is applied last inside the categorical draw.

use mlx_core::random::{categorical, KeyChain};
use mlx_core::{where_, Array, Dtype};

use crate::error::{Error, Result};

/// Sampling settings; the defaults are greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 means greedy. f64 like mlx-lm's Python floats: derived constants (1/T, ln min_p) are
    /// computed in double precision before they are rounded to the array's dtype.
    pub temperature: f64,
    /// Nucleus mass; enabled when 0 < top_p < 1.
    pub top_p: f64,
    /// Minimum probability relative to the top token; enabled when ≠ 0.
    pub min_p: f64,
    /// Tokens min-p always keeps.
    pub min_tokens_to_keep: usize,
    /// Keep the k most likely tokens; enabled when > 0.
    pub top_k: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig { temperature: 0.0, top_p: 0.0, min_p: 0.0, min_tokens_to_keep: 1, top_k: 0 }
    }
}

impl SamplerConfig {
    /// Greedy decoding.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig::default()
    }

    /// True when temperature is 0.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks ranges against a vocabulary of `vocab` tokens.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |detail: String| Err(Error::Input { op: "sampler", detail });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.min_tokens_to_keep < 1 {
            return bad("min_tokens_to_keep must be ≥ 1".into());
        }
        if self.top_k > 0 && self.top_k >= vocab {
            return bad(format!("top_k must be in (0, {vocab}), got {}", self.top_k));
        }
        Ok(())
    }
}

/// `logits − logsumexp(logits)` in the logits' dtype // `[.., V]`
pub fn logprobs(logits: &Array) -> Result<Array> {
    Ok(logits.subtract(&logits.logsumexp(&[-1], true)?)?)
}

fn neg_inf_like(x: &Array) -> Result<Array> {
    Ok(Array::scalar(f64::NEG_INFINITY, x.dtype())?)
}

/// Nucleus filter: keep tokens whose more-probable mass is below `top_p` of the total.
pub fn apply_top_p(lp: &Array, top_p: f64) -> Result<Array> {
    let sorted = lp.sort(-1)?;
    let probs = sorted.astype(Dtype::F32)?.exp()?;
    let above = probs.cumsum(-1, true, false)?;
    let total = above.slice_axis(-1, 0, 1)?.add(&probs.slice_axis(-1, 0, 1)?)?;
    let dropped = above.greater_equal(&total.mul_scalar(top_p)?)?.sum(&[-1], true)?;
    let threshold = sorted.take_along_axis(&dropped.astype(Dtype::U32)?, -1)?;
    Ok(where_(&lp.less(&threshold)?, &neg_inf_like(lp)?, lp)?)
}

/// Min-p filter: drop tokens below `max + ln(min_p)`, keeping at least `keep` tokens.
pub fn apply_min_p(lp: &Array, min_p: f64, keep: usize) -> Result<Array> {
    let top = lp.max(&[-1], true)?;
    let scaled = top.add_scalar(min_p.ln())?;
    let mut remove = lp.less(&scaled)?;
    if keep > 1 {
        let v = lp.dim(-1)?;
        let part = lp.argpartition(v - keep as i32, -1)?;
        let idx = part.slice_axis(-1, v - keep as i32, v)?;
        remove = remove.put_along_axis(&idx, &Array::scalar(0.0, Dtype::Bool)?, -1)?;
    }
    Ok(where_(&remove, &Array::scalar(f64::NEG_INFINITY, lp.dtype())?, lp)?)
}

/// Top-k filter (ties broken by argpartition order).
pub fn apply_top_k(lp: &Array, k: usize) -> Result<Array> {
    let v = lp.dim(-1)?;
    let neg = lp.negative()?;
    let mask_idx = neg.argpartition(k as i32 - 1, -1)?.slice_axis(-1, k as i32, v)?;
    Ok(lp.put_along_axis(&mask_idx, &neg_inf_like(lp)?, -1)?)
}

/// The enabled filters in mlx-lm's order (top-p, min-p, top-k); -inf marks removed tokens.
pub fn filter(lp: &Array, cfg: &SamplerConfig) -> Result<Array> {
    let mut x = lp.clone();
    if cfg.top_p > 0.0 && cfg.top_p < 1.0 {
        x = apply_top_p(&x, cfg.top_p)?;
    }
    if cfg.min_p != 0.0 {
        x = apply_min_p(&x, cfg.min_p, cfg.min_tokens_to_keep)?;
    }
    if cfg.top_k > 0 {
        x = apply_top_k(&x, cfg.top_k)?;
    }
    Ok(x)
}

/// A seeded sampler whose key chain follows `mx.random.seed(seed)` and one split per draw.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    keys: KeyChain,
}

impl Sampler {
    /// A sampler with `mx.random.seed(seed)` semantics.
    pub fn new(cfg: SamplerConfig, seed: u64) -> Result<Sampler> {
        Ok(Sampler { cfg, keys: KeyChain::new(seed)? })
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks a token per row from logprobs `[B, V]` (lazily; nothing is evaluated) -> `[B]` uint32.
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array> {
        if self.cfg.is_greedy() {
            return Ok(logprobs.argmax(-1, false)?);
        }
        let filtered = filter(logprobs, &self.cfg)?;
        let scaled = filtered.mul_scalar(1.0 / self.cfg.temperature)?;
        let key = self.keys.next_key()?;
        Ok(categorical(&scaled, -1, &key)?)
    }
}
