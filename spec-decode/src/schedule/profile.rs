//! The target's verify-cost profile on one device and compute dtype: v(n) = T_verify(n) /
//! T_decode(1), the time of one verify forward over n tokens (stepwise, tapped, with the LM
//! head, as the decode loop runs it) over the time of one plain decode step, after the same
//! context. The throughput schedule weighs expected accepted tokens against it, so it must be
//! measured where the model runs: `dspark profile` writes it next to the model
//! (`dspark-profile.json`, one entry per device and dtype) and the loop loads it.
//!
//! ```json
//! { "format": "dspark-verify-profile", "version": 1,
//!   "profiles": { "cpu-float32": { "cost": [1.02, 1.1, ...], "decodeMs": 9.8, "context": 64,
//!                                  "taps": [1, 3, 4, 6], "repeats": 7,
//!                                  "costSampled": [1.1, 1.2, ...], "draft": 0.4, "draftSampled": 0.7,
//!                                  "draftByLen": [0.2, 0.25, ...], "draftByLenSampled": [0.3, ...] } } }
//! ```
//!
//! `draftByLen[k - 1]` is the cost of proposing k drafts: the backbone runs over the whole
//! block, but the LM head rows, the Markov steps and the draws are paid per draft, so a round
//! whose window stays short (with the draft cap proposing little past it) is cheaper than one
//! proposing the whole block. Files written before it was measured still load (whole-block
//! pricing).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use gemma4::sampling::SamplerConfig;
use gemma4::{Model, TapSet};
use mlx_core::random::KeyChain;
use mlx_core::{Array, Device};
use serde::{Deserialize, Serialize};

use crate::drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
use crate::error::{Error, Result};

/// The file next to the model.
pub const PROFILE_FILE: &str = "dspark-profile.json";
const FORMAT: &str = "dspark-verify-profile";
const VERSION: u32 = 1;

/// One measured cost curve.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyProfile {
    /// v(n) for n = 1, 2, … tokens in the verify window.
    pub cost: Vec<f32>,
    /// Median time of one plain decode step, in milliseconds.
    pub decode_ms: f64,
    /// The same with the verdict of speculative sampling (T = 1) included: the target's
    /// probabilities, accept flags and draws grow with the window too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_sampled: Option<Vec<f32>>,
    /// Tokens in the cache when measured.
    pub context: usize,
    /// Tapped layers of the verify forward.
    pub taps: Vec<usize>,
    /// Timed repetitions per point (the median is kept).
    pub repeats: usize,
    /// What the drafter's proposal of a full block costs, in decode steps, greedy and sampled
    /// (when profiled with a drafter). A round pays it whatever window it then verifies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<f32>,
    /// `draft` under sampled drafting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_sampled: Option<f32>,
    /// Proposing k = 1, 2, …, γ drafts, in decode steps, greedy and sampled (when profiled with
    /// a drafter; the last entry is the full block).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_by_len: Option<Vec<f32>>,
    /// `draft_by_len` under sampled drafting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_by_len_sampled: Option<Vec<f32>>,
    /// The batch curve: (rows, cost in decode steps) of a stepwise forward and its head over
    /// that many rows, up to a batched engine's largest forward; what the batch schedule prices
    /// rows with (rows from one session cost what rows from several do: each attends over its
    /// own cache of `context` tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<Vec<(usize, f32)>>,
}

/// A tap set as the profile records it: layer indices, the final norm as the layer count.
pub fn tap_layers(taps: &TapSet, model: &Model) -> Vec<usize> {
    taps.points()
        .iter()
        .map(|p| match p {
            gemma4::TapPoint::Layer(i) => *i,
            gemma4::TapPoint::FinalNorm => model.config().num_hidden_layers,
        })
        .collect()
}

impl VerifyProfile {
    /// Why this profile may not price rounds of `drafter` right (measured with other taps, or
    /// without a drafter's proposal cost), if it may not.
    pub fn mismatch(&self, drafter: &dyn Drafter, model: &Model) -> Option<String> {
        let taps = tap_layers(&drafter.taps(), model);
        if self.taps != taps {
            return Some(format!("it was measured with taps {:?}, this drafter reads {taps:?}", self.taps));
        }
        if self.draft.is_none() {
            return Some("it was measured without a drafter, so proposals are priced at 0".to_string());
        }
        self.draft_by_len
            .is_none()
            .then(|| "it was measured before proposals were priced by length, so every round pays a whole block".into())
    }

    /// The cost of a round that verifies n tokens, n = 1, 2, …, in decode steps: v(n) (with the
    /// sampled verdict for sampled decoding, when profiled) plus the proposal. The proposal is
    /// already paid when the window is chosen, but it is part of the round's time. With the draft
    /// cap (`draft_cap`), rounds that settle on a window of n − 1 drafts propose about one more,
    /// so the proposal is priced at n drafts (at least one, at most the block); without it, or
    /// when lengths were not profiled, every round pays the whole block.
    pub fn round_cost(&self, greedy: bool, draft_cap: bool) -> Vec<f32> {
        let (full, by_len) =
            if greedy { (self.draft, &self.draft_by_len) } else { (self.draft_sampled, &self.draft_by_len_sampled) };
        let verify = match (&self.cost_sampled, greedy) {
            (Some(c), false) if c.len() == self.cost.len() => c,
            _ => &self.cost,
        };
        let proposal = |n: usize| -> f32 {
            match by_len {
                Some(d) if draft_cap && !d.is_empty() => d[n.clamp(1, d.len()) - 1],
                _ => full.unwrap_or(0.0),
            }
        };
        verify.iter().enumerate().map(|(i, v)| v + proposal(i + 1)).collect()
    }
}

#[derive(Serialize, Deserialize)]
struct ProfileFile {
    format: String,
    version: u32,
    profiles: BTreeMap<String, VerifyProfile>,
}

/// The key of a profile: device and compute dtype (`cpu-float32`, `gpu-bfloat16`).
pub fn profile_key(device: Device, model: &Model) -> String {
    let d = match device {
        Device::Cpu => "cpu",
        Device::Gpu => "gpu",
    };
    format!("{d}-{}", model.dtype().as_str())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Measures v(1..=max_n) after `context` tokens, median of `repeats` timings per point
/// (interleaved, after one warm-up round), tapped for `drafter`; with a drafter, also what
/// proposing 1, 2, …, γ drafts costs, greedy and sampled (T = 1), in decode steps.
pub fn measure(
    model: &Model,
    mut drafter: Option<&mut dyn Drafter>,
    max_n: usize,
    context: usize,
    repeats: usize,
) -> Result<VerifyProfile> {
    let vocab = model.config().vocab_size as u32;
    if max_n < 2 || repeats == 0 || context < 2 {
        return Err(Error::Settings {
            field: "profile",
            detail: format!(
                "max_n {max_n}, context {context}, repeats {repeats}: expected max_n ≥ 2, context ≥ 2, repeats ≥ 1"
            ),
        });
    }
    // Ordinary ids spread over the vocabulary: the cost does not depend on which tokens.
    let ids = |n: usize, from: usize| -> Result<Array> {
        let v: Vec<u32> = (0..n).map(|i| 4 + ((from + i) as u32 * 7919) % (vocab.max(5) - 4)).collect();
        Ok(Array::from_slice(&v, &[1, n as i32])?)
    };
    let positions = model.config().max_position_embeddings;
    if context.saturating_add(max_n) > positions {
        return Err(Error::Settings {
            field: "profile",
            detail: format!(
                "context {context} + window {max_n} tokens exceeds the model's {positions} positions \
                 (max_position_embeddings)"
            ),
        });
    }
    let taps = drafter.as_ref().map_or_else(TapSet::default, |d| d.taps());
    let prompt: Vec<u32> = (0..context).map(|i| 4 + (i as u32 * 131) % (vocab.max(5) - 4)).collect();
    let mut pre = crate::decode::prefill(model, &taps, &prompt, 2048)?;
    // Every timed forward runs on a copy of the prefilled cache, so nothing is rolled back (a
    // wrapped sliding-window ring could not be). Copies are detached before the clock starts: a
    // clone shares the buffers, and its first write would time a copy of every one of them,
    // which a running request never pays (its writes are in place). That copy, the same for
    // every window, made v(n) look flatter than it is.
    let cache = pre.cache().clone();
    let fresh = || -> Result<gemma4::Cache> { Ok(cache.detached()?) };
    if let Some(d) = drafter.as_deref_mut() {
        d.reset(pre.take_ctx().as_ref(), pre.committed())?;
    }
    let anchor = Array::from_slice(&[pre.pending()], &[1])?;
    let tapped = (!taps.is_empty()).then_some(&taps);
    let t1 = SamplerConfig { temperature: 1.0, ..Default::default() };
    let mut keys = KeyChain::new(0)?;
    let gamma = drafter.as_ref().map_or(0, |d| d.gamma());
    let mut decode = Vec::new();
    // [k - 1] = times of proposing k drafts, greedy and sampled
    let (mut draft, mut draft_sampled) = (vec![Vec::new(); gamma], vec![Vec::new(); gamma]);
    let mut verify: Vec<Vec<f64>> = vec![Vec::new(); max_n];
    let mut verify_sampled: Vec<Vec<f64>> = vec![Vec::new(); max_n];
    // The batch curve's row counts, up to a batched engine's largest forward.
    let batch_rows: Vec<usize> =
        BATCH_ROWS.iter().copied().filter(|&n| context.saturating_add(n) <= positions).collect();
    let mut batch: Vec<Vec<f64>> = vec![Vec::new(); batch_rows.len()];
    for rep in 0..=repeats {
        // A stepwise tapped forward of n rows and its head, evaluated, in seconds.
        let timed = |n: usize| -> Result<f64> {
            let mut c = fresh()?;
            let t = Instant::now();
            let out = model.forward_stepwise(&ids(n, rep)?, &mut c, tapped)?;
            let logits = model.logits_from_hidden(&out.hidden)?;
            match &out.taps {
                Some(rows) => mlx_core::eval(&[&logits, rows])?,
                None => logits.eval()?,
            }
            Ok(t.elapsed().as_secs_f64())
        };
        for (n, times) in verify.iter_mut().enumerate() {
            let n = n + 1;
            let dt = timed(n)?;
            if rep > 0 {
                times.push(dt);
            }
            // The same window verified by speculative sampling (T = 1): the forward, the
            // target's probabilities, the accept flags, residual and bonus draws, one read.
            let mut c = fresh()?;
            let t = Instant::now();
            let out = model.forward_stepwise(&ids(n, rep)?, &mut c, tapped)?;
            let logits = model.logits_from_hidden(&out.hidden)?.squeeze(0)?; // [n, V]
            let proposal = (n > 1)
                .then(|| -> Result<Proposal> {
                    let tokens = ids(n - 1, rep)?.reshape(&[n as i32 - 1])?.astype(mlx_core::Dtype::U32)?;
                    let q = logits.slice_axis(0, 0, n as i32 - 1)?.softmax(&[-1], true)?;
                    Ok(Proposal { tokens, logits: None, q: Some(q), confidence: None })
                })
                .transpose()?;
            let mut stats = crate::SpecStats::default();
            let rule = crate::verify::rule::VerifyRule::Exact;
            crate::verify::sampled_verdict(&logits, proposal.as_ref(), &t1, &mut keys, rule, &mut stats)?;
            if let Some(rows) = &out.taps {
                rows.eval()?;
            }
            let dt = t.elapsed().as_secs_f64();
            if rep > 0 {
                verify_sampled[n - 1].push(dt);
            }
        }
        // The decode step, timed while the machine is busy decoding as it is during a request
        // (timed first in a round, it paid for waking the idle row-kernel helper thread).
        let mut c = fresh()?;
        let t = Instant::now();
        let h = model.forward(&ids(1, rep)?, Some(&mut c))?;
        model.logits_from_hidden(&h)?.eval()?;
        let one = t.elapsed().as_secs_f64();
        if let Some(d) = drafter.as_deref_mut() {
            for (greedy, by_len) in [(true, &mut draft), (false, &mut draft_sampled)] {
                for (k, times) in by_len.iter_mut().enumerate() {
                    let sampling = if greedy {
                        DraftSampling::Greedy
                    } else {
                        DraftSampling::Sample { cfg: &t1, keys: &mut keys }
                    };
                    let req = DraftRequest {
                        anchor: &anchor,
                        position: cache.offset(),
                        max_drafts: k + 1,
                        sampling,
                        target: model,
                        target_cache: &cache,
                    };
                    let t = Instant::now();
                    let p = d.propose(req)?;
                    let mut outs = vec![&p.tokens];
                    outs.extend(p.q.as_ref());
                    outs.extend(p.confidence.as_ref());
                    mlx_core::eval(&outs)?;
                    if rep > 0 {
                        times.push(t.elapsed().as_secs_f64());
                    }
                }
            }
        }
        for (k, &n) in batch_rows.iter().enumerate() {
            let dt = timed(n)?;
            if rep > 0 {
                batch[k].push(dt);
            }
        }
        if rep > 0 {
            decode.push(one);
        }
    }
    let one = median(decode);
    let steps = |by_len: Vec<Vec<f64>>| -> Option<Vec<f32>> {
        (gamma > 0).then(|| by_len.into_iter().map(|t| (median(t) / one) as f32).collect())
    };
    let (draft_by_len, draft_by_len_sampled) = (steps(draft), steps(draft_sampled));
    Ok(VerifyProfile {
        cost: verify.into_iter().map(|t| (median(t) / one) as f32).collect(),
        cost_sampled: Some(verify_sampled.into_iter().map(|t| (median(t) / one) as f32).collect()),
        decode_ms: one * 1e3,
        context,
        taps: tap_layers(&taps, model),
        repeats,
        draft: draft_by_len.as_ref().and_then(|d| d.last().copied()),
        draft_sampled: draft_by_len_sampled.as_ref().and_then(|d| d.last().copied()),
        draft_by_len,
        draft_by_len_sampled,
        batch: Some(batch_rows.into_iter().zip(batch).map(|(n, t)| (n, (median(t) / one) as f32)).collect()),
    })
}

/// Row counts the batch curve is measured at (a batched engine's forwards hold at most 64 rows,
/// the row kernels' bound); the schedule interpolates between them.
pub const BATCH_ROWS: [usize; 10] = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64];

fn read_file(path: &Path) -> Result<Option<ProfileFile>> {
    let text = match mlx_core::files::read_text(path, mlx_core::files::JSON_LIMIT) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(Error::Io { path: path.to_path_buf(), source }),
    };
    let f: ProfileFile =
        serde_json::from_str(&text).map_err(|e| Error::checkpoint(path, format!("invalid profile: {e}")))?;
    if f.format != FORMAT || f.version != VERSION {
        return Err(Error::checkpoint(
            path,
            format!("format {:?} version {}: expected {FORMAT:?} version {VERSION}", f.format, f.version),
        ));
    }
    for (key, p) in &f.profiles {
        if p.cost.len() < 2 || p.cost.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(Error::checkpoint(path, format!("profiles.{key}.cost: expected at least 2 positive costs")));
        }
        if let Some(c) = &p.cost_sampled {
            if c.len() != p.cost.len() || c.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(Error::checkpoint(
                    path,
                    format!("profiles.{key}.costSampled: expected {} positive costs, as many as cost", p.cost.len()),
                ));
            }
        }
        for (field, by_len) in [("draftByLen", &p.draft_by_len), ("draftByLenSampled", &p.draft_by_len_sampled)] {
            if let Some(d) = by_len {
                if d.is_empty() || d.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
                    return Err(Error::checkpoint(
                        path,
                        format!("profiles.{key}.{field}: expected one non-negative cost per draft length, 1 to γ"),
                    ));
                }
            }
        }
    }
    Ok(Some(f))
}

/// The profile stored next to the model for `key`, if any.
pub fn load(model_dir: &Path, key: &str) -> Result<Option<VerifyProfile>> {
    Ok(read_file(&model_dir.join(PROFILE_FILE))?.and_then(|mut f| f.profiles.remove(key)))
}

/// Stores `profile` under `key` next to the model (other keys are kept), atomically.
pub fn store(model_dir: &Path, key: &str, profile: &VerifyProfile) -> Result<PathBuf> {
    let path = model_dir.join(PROFILE_FILE);
    let mut f =
        read_file(&path)?.unwrap_or(ProfileFile { format: FORMAT.into(), version: VERSION, profiles: BTreeMap::new() });
    f.profiles.insert(key.to_string(), profile.clone());
    let body = serde_json::to_string_pretty(&f).map_err(|e| Error::Contract(e.to_string()))? + "\n";
    mlx_core::files::write_atomic(&path, body.as_bytes()).map_err(|source| Error::Io { path: path.clone(), source })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dspark-profile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn profile(cost: Vec<f32>) -> VerifyProfile {
        VerifyProfile {
            cost,
            cost_sampled: None,
            decode_ms: 10.0,
            context: 64,
            taps: vec![1, 2],
            repeats: 3,
            draft: Some(0.5),
            draft_sampled: None,
            draft_by_len: None,
            draft_by_len_sampled: None,
            batch: None,
        }
    }

    #[test]
    fn stores_by_key_and_keeps_the_others() {
        let d = scratch("keys");
        assert_eq!(load(&d, "cpu-float32").unwrap(), None, "no file: no profile");
        store(&d, "cpu-float32", &profile(vec![1.0, 1.1])).unwrap();
        store(&d, "gpu-bfloat16", &profile(vec![1.0, 1.05, 1.1])).unwrap();
        assert_eq!(load(&d, "cpu-float32").unwrap().unwrap().cost, vec![1.0, 1.1]);
        assert_eq!(load(&d, "gpu-bfloat16").unwrap().unwrap().cost.len(), 3);
        assert_eq!(load(&d, "cpu-bfloat16").unwrap(), None);
        let p = load(&d, "cpu-float32").unwrap().unwrap();
        assert_eq!(p.round_cost(true, true), vec![1.5, 1.6], "the proposal is part of every round");
        assert_eq!(p.round_cost(false, true), vec![1.0, 1.1], "not profiled sampled: verify cost only");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn capped_rounds_pay_for_the_drafts_they_propose() {
        let mut p = profile(vec![1.0, 1.1, 1.2, 1.3]);
        p.draft_by_len = Some(vec![0.1, 0.2, 0.5]);
        p.draft = Some(0.5);
        p.draft_sampled = Some(0.9);
        p.draft_by_len_sampled = Some(vec![0.3, 0.6, 0.9]);
        let close = |a: Vec<f32>, b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6) && a.len() == b.len();
        // n = 1 (a plain step) still proposes one draft; n past the block proposes the block.
        assert!(close(p.round_cost(true, true), &[1.1, 1.3, 1.7, 1.8]), "{:?}", p.round_cost(true, true));
        assert!(close(p.round_cost(false, true), &[1.3, 1.7, 2.1, 2.2]), "{:?}", p.round_cost(false, true));
        assert!(
            close(p.round_cost(true, false), &[1.5, 1.6, 1.7, 1.8]),
            "whole blocks: {:?}",
            p.round_cost(true, false)
        );
        let mut stale = profile(vec![1.0, 1.1]);
        stale.draft_by_len = None;
        assert!(close(stale.round_cost(true, true), &[1.5, 1.6]), "older files price the whole block");
    }

    #[test]
    fn bad_files_are_named() {
        let d = scratch("bad");
        std::fs::write(d.join(PROFILE_FILE), "{").unwrap();
        let e = load(&d, "cpu-float32").unwrap_err().to_string();
        assert!(e.contains(PROFILE_FILE) && e.contains("invalid profile"), "{e}");
        let body = r#"{"format":"dspark-verify-profile","version":1,"profiles":{"cpu-float32":
            {"cost":[1.0,-2.0],"decodeMs":1.0,"context":8,"taps":[],"repeats":1}}}"#;
        std::fs::write(d.join(PROFILE_FILE), body).unwrap();
        let e = load(&d, "cpu-float32").unwrap_err().to_string();
        assert!(e.contains("profiles.cpu-float32.cost"), "{e}");
        let body = r#"{"format":"dspark-verify-profile","version":1,"profiles":{"cpu-float32":
            {"cost":[1.0,1.1],"decodeMs":1.0,"context":8,"taps":[],"repeats":1,"draftByLen":[]}}}"#;
        std::fs::write(d.join(PROFILE_FILE), body).unwrap();
        let e = load(&d, "cpu-float32").unwrap_err().to_string();
        assert!(e.contains("profiles.cpu-float32.draftByLen"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
