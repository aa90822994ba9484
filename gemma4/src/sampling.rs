//! Token selection as mlx-lm's `make_sampler` applies it: greedy is the argmax
//! of bf16 **logprobs** (not logits); otherwise top-p, min-p, top-k filter the T = 1
//! logprobs in that order, and temperature is applied last inside the categorical draw.
//! An OpenAI `logit_bias` is added to the logits before all of that, as mlx-lm's logit-bias
//! processor does ([`apply_logit_bias`]).

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
    /// OpenAI's `logit_bias`: (token id, bias in [-100, 100]) added to the model's logits
    /// before everything above; ids distinct and below the vocabulary. Empty: no extra op.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            min_tokens_to_keep: 1,
            top_k: 0,
            logit_bias: Vec::new(),
        }
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
        check_logit_bias(&self.logit_bias, None).or_else(|e| bad(format!("logit_bias: {e}")))
    }

    /// Checks every range against a vocabulary of `vocab` tokens.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        self.validate_ranges()?;
        let bad = |detail: String| Error::Input { op: "sampler", detail };
        check_top_k(self.top_k, vocab).map_err(|e| bad(format!("top_k: {e}")))?;
        check_logit_bias(&self.logit_bias, Some(vocab)).map_err(|e| bad(format!("logit_bias: {e}")))
    }
}

/// The largest |bias| OpenAI's `logit_bias` takes.
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// A `logit_bias` the samplers can apply: finite biases in [-100, 100], each token id once
/// and, when `vocab` is given, below it. Returns what is wrong in words, naming the entry.
pub fn check_logit_bias(bias: &[(u32, f32)], vocab: Option<usize>) -> std::result::Result<(), String> {
    let mut seen = std::collections::HashSet::with_capacity(bias.len());
    for &(id, b) in bias {
        if !(b.is_finite() && (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&b)) {
            return Err(format!("the bias of token {id} must be a finite number in [-100, 100], got {b}"));
        }
        if let Some(v) = vocab.filter(|&v| id as usize >= v) {
            return Err(format!("token id {id} is outside the vocabulary of {v} tokens"));
        }
        // A scatter with repeated indices keeps an unspecified one of the sums.
        if !seen.insert(id) {
            return Err(format!("token id {id} is given more than once"));
        }
    }
    Ok(())
}

/// Adds `bias` to the logits of its tokens in every row, as mlx-lm's logit-bias processor
/// (`logits[:, ids] += values`): the sum in f32, rounded back to the logits' dtype. With no
/// bias the logits come back as they are (no op is added). Checked like
/// [`check_logit_bias`] against the rows' width. `logits` // `[.., V]` -> `[.., V]`
pub fn apply_logit_bias(logits: &Array, bias: &[(u32, f32)]) -> Result<Array> {
    if bias.is_empty() {
        return Ok(logits.clone());
    }
    let v = logits.dim(-1)?;
    check_logit_bias(bias, Some(v as usize)).map_err(|detail| Error::Input { op: "logit_bias", detail })?;
    let shape = logits.shape()?;
    let rows = logits.reshape(&[-1, v])?; // [R, V]
    let (r, n) = (rows.dim(0)?, bias.len() as i32);
    let ids: Vec<u32> = bias.iter().map(|&(id, _)| id).collect();
    let values: Vec<f32> = bias.iter().map(|&(_, b)| b).collect();
    let idx = Array::from_slice(&ids, &[1, n])?.broadcast_to(&[r, n])?; // [R, n]
    let values = Array::from_slice(&values, &[1, n])?; // [1, n] f32
    let picked = rows.take_along_axis(&idx, -1)?.astype(Dtype::F32)?.add(&values)?.astype(rows.dtype())?; // [R, n]
    Ok(rows.put_along_axis(&idx, &picked, -1)?.reshape(&shape)?)
}

/// The logprobs a sampler with `cfg` draws from: `logit_bias` applied, then [`logprobs`]
/// (exactly [`logprobs`] when there is no bias). `logits` // `[.., V]` -> `[.., V]`
pub fn biased_logprobs(logits: &Array, cfg: &SamplerConfig) -> Result<Array> {
    logprobs(&apply_logit_bias(logits, &cfg.logit_bias)?)
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

/// `logits − logsumexp(logits)` in the logits' dtype // `[.., V]` (f32 on the CPU: one row
/// node, see `mlx_core::blas::log_softmax`)
pub fn logprobs(logits: &Array) -> Result<Array> {
    Ok(mlx_core::blas::log_softmax(logits)?)
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

    fn greedy_pick(logits: &[f32], bias: &[(u32, f32)]) -> u32 {
        let l = Array::from_slice(logits, &[1, logits.len() as i32]).unwrap().astype(Dtype::Bf16).unwrap();
        let cfg = SamplerConfig { logit_bias: bias.to_vec(), ..SamplerConfig::greedy() };
        let mut s = Sampler::new(cfg.clone(), 0).unwrap();
        s.sample(&biased_logprobs(&l, &cfg).unwrap()).unwrap().astype(Dtype::U32).unwrap().item::<u32>().unwrap()
    }

    #[test]
    fn a_logit_bias_moves_the_greedy_pick() {
        let logits = [1.0, 7.5, -3.0, 2.0, 0.25];
        assert_eq!(greedy_pick(&logits, &[]), 1);
        // +100 on the least likely token makes it the argmax.
        assert_eq!(greedy_pick(&logits, &[(2, 100.0)]), 2);
        // -100 on the argmax removes it: the runner-up wins.
        assert_eq!(greedy_pick(&logits, &[(1, -100.0)]), 3);
        // Several entries, in any order.
        assert_eq!(greedy_pick(&logits, &[(1, -100.0), (0, 1.5)]), 0);
    }

    #[test]
    fn a_logit_bias_adds_in_f32_and_keeps_the_dtype_and_shape() {
        let l = Array::from_slice(&[0.5f32, 1.0, 2.0, 4.0, 0.0, 0.0, 0.0, 0.0], &[2, 1, 4]).unwrap();
        let b = apply_logit_bias(&l.astype(Dtype::Bf16).unwrap(), &[(3, -0.25), (0, 2.0)]).unwrap();
        assert_eq!(b.dtype(), Dtype::Bf16);
        assert_eq!(b.shape().unwrap(), [2, 1, 4]);
        assert_eq!(b.astype(Dtype::F32).unwrap().to_f32_vec().unwrap(), [2.5, 1.0, 2.0, 3.75, 2.0, 0.0, 0.0, -0.25]);
        // No bias: the very same array.
        assert_eq!(apply_logit_bias(&l, &[]).unwrap().to_f32_vec().unwrap(), l.to_f32_vec().unwrap());
    }

    #[test]
    fn bad_logit_biases_are_refused_naming_the_field_and_the_entry() {
        for (bias, want) in [
            (vec![(3, 100.5f32)], "token 3"),
            (vec![(3, f32::NAN)], "NaN"),
            (vec![(5, f32::NEG_INFINITY)], "token 5"),
            (vec![(7, 1.0), (7, 2.0)], "token id 7 is given more than once"),
        ] {
            let cfg = SamplerConfig { logit_bias: bias, ..SamplerConfig::default() };
            let e = cfg.validate_ranges().unwrap_err().to_string();
            assert!(e.contains("logit_bias") && e.contains(want), "{e}");
        }
        let cfg = SamplerConfig { logit_bias: vec![(1, -100.0), (4096, 1.0)], ..SamplerConfig::default() };
        assert!(cfg.validate_ranges().is_ok());
        let e = cfg.validate(4096).unwrap_err().to_string();
        assert!(e.contains("logit_bias") && e.contains("token id 4096") && e.contains("4096 tokens"), "{e}");
        // Applying an unchecked bias refuses an id past the row instead of scattering there.
        let l = Array::from_slice(&[0.0f32; 4], &[1, 4]).unwrap();
        let e = apply_logit_bias(&l, &[(4, 1.0)]).unwrap_err().to_string();
        assert!(e.contains("logit_bias") && e.contains("token id 4"), "{e}");
    }
}
