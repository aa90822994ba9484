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

    /// Checks every range that does not depend on the vocabulary (top-k is checked by
    /// [`SamplerConfig::validate`] once the model is known).
    pub fn validate_ranges(&self) -> Result<()> {
        let bad = |detail: String| Err(Error::Input { op: "sampler", detail });
        check_temperature(self.temperature).or_else(|e| bad(format!("temperature: {e}")))?;
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad(format!("top_p must be in [0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if self.min_tokens_to_keep < 1 {
            return bad("min_tokens_to_keep must be ≥ 1".into());
        }
        Ok(())
    }

    /// Checks every range against a vocabulary of `vocab` tokens.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        self.validate_ranges()?;
        check_top_k(self.top_k, vocab)
            .map_err(|detail| Error::Input { op: "sampler", detail: format!("top_k: {detail}") })
    }
}

/// A temperature the samplers can apply: 0 (greedy), or a positive T whose factor 1/T is a
/// normal, finite f32 (the kernels scale f32 logprobs by it: T = 1e-45 would make it infinite,
/// T = 1e308 zero). Returns what is wrong in words.
pub fn check_temperature(t: f64) -> std::result::Result<(), String> {
    if t == 0.0 {
        return Ok(());
    }
    let inv = (1.0 / t) as f32;
    if t.is_finite() && t > 0.0 && inv.is_finite() && inv >= f32::MIN_POSITIVE {
        return Ok(());
    }
    Err(format!(
        "expected 0 (greedy) or a positive number between {:.1e} and {:.1e} (1/T must be a finite, \
         positive f32), got {t:?}",
        1.0 / f64::from(f32::MAX),
        1.0 / f64::from(f32::MIN_POSITIVE)
    ))
}

/// A top-k setting for a vocabulary of `vocab` tokens: 0 (off) or 1 ..= vocab − 1 (keeping
/// every token is the same as off, and the filter needs a token to drop).
pub fn check_top_k(k: usize, vocab: usize) -> std::result::Result<(), String> {
    if k == 0 || k < vocab {
        return Ok(());
    }
    Err(format!(
        "expected 0 (off) or 1..={} (below the vocabulary of {vocab} tokens), got {k}",
        vocab.saturating_sub(1)
    ))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperatures_whose_inverse_leaves_f32_are_refused() {
        for t in [0.0, 1.0, 0.7, 1e-30, 1e30] {
            assert!(check_temperature(t).is_ok(), "{t}");
        }
        for t in [1e308, 1e-300, 1e-45, -0.5, f64::NAN, f64::INFINITY] {
            let e = check_temperature(t).unwrap_err();
            assert!(e.contains("1/T"), "{t}: {e}");
        }
        let cfg = SamplerConfig { temperature: 1e-45, ..SamplerConfig::default() };
        assert!(cfg.validate_ranges().unwrap_err().to_string().contains("temperature"));
    }

    #[test]
    fn top_k_states_the_vocabulary_range() {
        assert!(check_top_k(0, 4096).is_ok());
        assert!(check_top_k(4095, 4096).is_ok());
        let e = check_top_k(usize::MAX, 4096).unwrap_err();
        assert!(e.contains("1..=4095") && e.contains("4096"), "{e}");
        assert!(!e.contains("18446744073709551615)"), "{e}");
        // The vocabulary-free check does not look at top_k at all.
        let cfg = SamplerConfig { top_k: usize::MAX, ..SamplerConfig::default() };
        assert!(cfg.validate_ranges().is_ok());
        assert!(cfg.validate(4096).is_err());
    }
}
