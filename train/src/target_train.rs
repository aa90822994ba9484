//! Training a Gemma-4 target from scratch with next-token cross-entropy: the model's own
//! forward (`gemma4::Model`, rebuilt each step from the parameter arrays being differentiated),
//! MLX's autodiff, AdamW with warmup + cosine decay and global-norm clipping. Parameters are
//! f32 (the fast CPU path); the checkpoint is written in a chosen dtype in gemma4's own layout.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use gemma4::checkpoint::{param_specs, random_weights, Init};
use gemma4::weights::WeightMap;
use gemma4::{Model, TextConfig};
use mlx_core::{value_and_grad, Array, Dtype};

use crate::error::{Error, Result};
use crate::{clip_global_norm, AdamW, AdamWConfig, SplitMix64, WarmupCosine};

/// Hyper-parameters of a target run.
#[derive(Clone, Debug)]
pub struct TargetTrainConfig {
    /// Total optimizer steps; the learning-rate schedule spans them.
    pub steps: u64,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence (each predicts the next; windows of `seq_len + 1` are drawn).
    pub seq_len: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps before the cosine decay.
    pub warmup: u64,
    /// AdamW's decoupled weight decay λ.
    pub weight_decay: f64,
    /// Global gradient-norm clip.
    pub clip: f64,
    /// Seed of the training-window draws.
    pub seed: u64,
    /// Validation every this many steps (and at the end); 0: only at the end.
    pub eval_every: u64,
    /// Fixed validation windows (drawn once from the validation stream with their own seed).
    pub eval_windows: usize,
}

impl Default for TargetTrainConfig {
    fn default() -> Self {
        TargetTrainConfig {
            steps: 1000,
            batch: 8,
            seq_len: 256,
            lr: 3e-3,
            warmup: 50,
            weight_decay: 0.01,
            clip: 1.0,
            seed: 0,
            eval_every: 100,
            eval_windows: 32,
        }
    }
}

impl TargetTrainConfig {
    /// Checks every setting before any work: a NaN learning rate would train to NaN weights
    /// and exit 0; a zero batch or a one-token sequence has nothing to learn from.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str, detail: String| Err(Error::Invalid { what: what.into(), detail });
        if self.steps == 0 {
            return bad("steps", "0: expected at least 1 step".into());
        }
        if self.batch == 0 {
            return bad("batch", "0: expected at least 1 sequence per step".into());
        }
        if self.seq_len < 2 {
            return bad("seq_len", format!("{}: expected at least 2 tokens per sequence", self.seq_len));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", format!("{}: expected a finite learning rate > 0", self.lr));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", format!("{}: expected a finite number ≥ 0", self.weight_decay));
        }
        if !(self.clip.is_finite() && self.clip > 0.0) {
            return bad("clip", format!("{}: expected a finite gradient-norm clip > 0", self.clip));
        }
        if self.eval_windows == 0 {
            return bad("eval_windows", "0: expected at least 1 validation window".into());
        }
        Ok(())
    }
}

/// What a progress callback sees after each step.
#[derive(Clone, Debug)]
pub struct TargetProgress {
    /// This step, 1-based.
    pub step: u64,
    /// Total steps of the run.
    pub steps: u64,
    /// Training loss of the step (nats per token).
    pub loss: f32,
    /// Learning rate of the step.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// Training tokens per second of this step.
    pub tokens_per_s: f64,
    /// Mean validation loss (nats per token) when this step evaluated.
    pub val_loss: Option<f64>,
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct TargetReport {
    /// Parameter names, in the order of `params`.
    pub names: Vec<String>,
    /// The trained parameters.
    pub params: Vec<Array>,
    /// Mean validation loss (nats per token) before the first step.
    pub initial_val_loss: f64,
    /// Mean validation loss after the last step.
    pub final_val_loss: f64,
    /// Training loss of every step.
    pub losses: Vec<f32>,
    /// Wall time of the run, in seconds.
    pub seconds: f64,
}

/// A small genuine Gemma-4 text config: sliding layers (window `window`) with a full layer
/// every fourth and last, partial rotary (¼) on full layers, logit softcap 30, tied head, GQA
/// with one KV head, MLP 4× hidden. Token ids: 0 pad, 1 eos, 2 bos.
pub fn small_config(vocab: usize, hidden: usize, layers: usize, heads: usize, window: usize) -> Result<TextConfig> {
    let bad = |what: &str, detail: String| Err(Error::Invalid { what: what.into(), detail });
    if hidden == 0 || layers == 0 || heads == 0 || window == 0 {
        let zero = [("hidden", hidden), ("layers", layers), ("heads", heads), ("window", window)];
        let names: Vec<&str> = zero.iter().filter(|(_, v)| *v == 0).map(|(n, _)| *n).collect();
        return bad("target shape", format!("{} must be at least 1", names.join(", ")));
    }
    if !hidden.is_multiple_of(heads) {
        return bad("target shape", format!("hidden {hidden} must be a multiple of heads {heads}"));
    }
    // Full layers rotate a quarter of each head in pairs: the head needs 8 | head_dim.
    if !(hidden / heads).is_multiple_of(8) {
        return bad(
            "target shape",
            format!("head size hidden/heads = {} must be a multiple of 8 (partial rotary)", hidden / heads),
        );
    }
    let kinds: Vec<&str> = (0..layers)
        .map(|i| if (i + 1) % 4 == 0 || i + 1 == layers { "full_attention" } else { "sliding_attention" })
        .collect();
    let head_dim = hidden / heads;
    let v = serde_json::json!({
        "model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": layers,
        "layer_types": kinds, "num_kv_shared_layers": 0,
        "intermediate_size": 4 * hidden, "use_double_wide_mlp": false,
        "num_attention_heads": heads, "num_key_value_heads": 1, "head_dim": head_dim,
        "global_head_dim": head_dim, "num_global_key_value_heads": null, "attention_k_eq_v": false,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
        "sliding_window": window, "hidden_size_per_layer_input": 0,
        "vocab_size": vocab, "vocab_size_per_layer_input": vocab, "final_logit_softcapping": 30.0,
        "enable_moe_block": false, "tie_word_embeddings": true, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
    });
    Ok(TextConfig::from_json_str(&v.to_string()).map_err(gemma4::Error::from)?)
}

/// Initial parameters: gemma4's random init for matrices (N(0, 1/fan_in)), norms and scalars at
/// exactly 1 (a trained model starts from identity scales, not the random-test draws).
pub fn init_params(cfg: &TextConfig, seed: u64) -> Result<(Vec<String>, Vec<Array>)> {
    let mut weights = random_weights(cfg, seed, Dtype::F32)?;
    for spec in param_specs(cfg) {
        if matches!(spec.init, Init::Norm | Init::Scalar) {
            weights.insert(spec.name.clone(), Array::ones(&spec.shape, Dtype::F32)?);
        }
    }
    Ok(weights.into_iter().unzip())
}

/// The model whose weights are `params` (same order as `names`).
pub fn model_from(cfg: &TextConfig, names: &[String], params: &[Array]) -> Result<Model> {
    let map: BTreeMap<String, Array> = names.iter().cloned().zip(params.iter().cloned()).collect();
    let mut wm = WeightMap::from_tensors(Path::new("<training parameters>"), map, "", None);
    let model = Model::from_weights(cfg.clone(), &mut wm)?;
    wm.finish()?;
    Ok(model)
}

/// Mean next-token cross-entropy (nats) of windows `ids` // `[B, L + 1]` -> scalar
pub fn lm_loss(model: &Model, ids: &Array) -> Result<Array> {
    let s = ids.shape()?;
    let (b, l1) = (s[0], s[1]);
    let inputs = ids.slice_axis(1, 0, l1 - 1)?; // [B, L]
    let targets = ids.slice_axis(1, 1, l1)?.reshape(&[b, l1 - 1, 1])?; // [B, L, 1]
    let logits = model.logits(&inputs, None)?.astype(Dtype::F32)?; // [B, L, V]
    let lse = logits.logsumexp(&[-1], false)?; // [B, L]
    let picked = logits.take_along_axis(&targets, -1)?.squeeze(-1)?; // [B, L]
    Ok(lse.subtract(&picked)?.mean_all()?)
}

/// `n` windows of `len` tokens from `stream` at positions drawn by `rng` // `[n, len]` uint32
fn windows(stream: &[u32], n: usize, len: usize, rng: &mut SplitMix64) -> Result<Array> {
    let span = stream.len().checked_sub(len).filter(|&s| s > 0).ok_or_else(|| Error::Invalid {
        what: "token stream".into(),
        detail: format!("{} tokens cannot hold a window of {len}", stream.len()),
    })?;
    let mut ids = Vec::with_capacity(n * len);
    for _ in 0..n {
        let start = rng.below(span as u64) as usize;
        ids.extend_from_slice(&stream[start..start + len]);
    }
    Ok(Array::from_slice(&ids, &[n as i32, len as i32])?)
}

/// Mean validation loss over fixed windows (evaluated a few at a time to bound memory).
pub fn eval_loss(cfg: &TextConfig, names: &[String], params: &[Array], batches: &[Array]) -> Result<f64> {
    let model = model_from(cfg, names, params)?;
    let mut sum = 0f64;
    for b in batches {
        sum += lm_loss(&model, b)?.to_f32_vec()?.first().copied().unwrap_or(f32::NAN) as f64;
    }
    Ok(sum / batches.len().max(1) as f64)
}

/// Trains from `init` on the `train` token stream, validating on `val`.
pub fn train_target(
    cfg: &TextConfig,
    init: (Vec<String>, Vec<Array>),
    train: &[u32],
    val: &[u32],
    tc: &TargetTrainConfig,
    mut progress: impl FnMut(&TargetProgress),
) -> Result<TargetReport> {
    tc.validate()?;
    let (names, mut params) = init;
    let vocab = cfg.vocab_size as u32;
    if let Some(bad) = train.iter().chain(val).find(|&&t| t >= vocab) {
        return Err(Error::Invalid { what: "token stream".into(), detail: format!("id {bad} ≥ vocabulary {vocab}") });
    }
    let mut val_rng = SplitMix64::new(tc.seed ^ 0x5a17_da7a);
    let per = tc.batch.min(tc.eval_windows.max(1));
    let val_batches: Vec<Array> = (0..tc.eval_windows.max(1).div_ceil(per))
        .map(|_| windows(val, per, tc.seq_len + 1, &mut val_rng))
        .collect::<Result<_>>()?;
    let mut opt = AdamW::new(AdamWConfig { weight_decay: tc.weight_decay, ..Default::default() }, &params)?;
    let sched = WarmupCosine::new(tc.lr, tc.warmup, tc.steps);
    let mut rng = SplitMix64::new(tc.seed);
    let argnums: Vec<usize> = (0..params.len()).collect();
    let initial_val_loss = eval_loss(cfg, &names, &params, &val_batches)?;
    let mut final_val_loss = initial_val_loss;
    let mut losses = Vec::with_capacity(tc.steps as usize);
    let t0 = Instant::now();
    for step in 0..tc.steps {
        let t = Instant::now();
        let batch = windows(train, tc.batch, tc.seq_len + 1, &mut rng)?;
        let (values, grads) = value_and_grad(
            |xs: &[Array]| -> Result<Vec<Array>> { Ok(vec![lm_loss(&model_from(cfg, &names, xs)?, &batch)?]) },
            &params,
            &argnums,
        )?;
        let (grads, norm) = clip_global_norm(&grads, tc.clip)?;
        let lr = sched.lr(step);
        params = opt.step(&params, &grads, lr)?;
        let mut to_eval: Vec<&Array> = params.iter().chain(opt.state_arrays()).collect();
        to_eval.push(&values[0]);
        mlx_core::eval(&to_eval)?;
        let loss = values[0].to_f32_vec()?.first().copied().unwrap_or(f32::NAN);
        if !loss.is_finite() {
            return Err(Error::Invalid { what: format!("step {step}"), detail: format!("the loss is {loss}") });
        }
        losses.push(loss);
        let last = step + 1 == tc.steps;
        let val_loss = if last || (tc.eval_every > 0 && (step + 1) % tc.eval_every == 0) {
            final_val_loss = eval_loss(cfg, &names, &params, &val_batches)?;
            Some(final_val_loss)
        } else {
            None
        };
        progress(&TargetProgress {
            step: step + 1,
            steps: tc.steps,
            loss,
            lr,
            grad_norm: norm.to_f32_vec()?.first().copied().unwrap_or(f32::NAN),
            tokens_per_s: (tc.batch * tc.seq_len) as f64 / t.elapsed().as_secs_f64().max(1e-9),
            val_loss,
        });
    }
    Ok(TargetReport { names, params, initial_val_loss, final_val_loss, losses, seconds: t0.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tiny_target_learns_a_repeating_text() {
        let cfg = gemma4::config::tiny_dense_config(64, 48, 2).unwrap();
        // A cyclic "text" of period 12 over 12 token ids: fully predictable after one period.
        let stream: Vec<u32> = (0..2000u32).map(|i| 4 + (i * 5) % 12).collect();
        let tc = TargetTrainConfig {
            steps: 60,
            batch: 4,
            seq_len: 24,
            lr: 1e-2,
            warmup: 5,
            eval_every: 0,
            eval_windows: 4,
            ..Default::default()
        };
        let init = init_params(&cfg, 1).unwrap();
        let report = train_target(&cfg, init, &stream, &stream, &tc, |_| {}).unwrap();
        let (first, last) = (report.losses[0], *report.losses.last().unwrap());
        assert!(last < 0.1 * first, "training loss {first} -> {last}: expected a > 90% fall");
        assert!(report.final_val_loss < 0.1 * report.initial_val_loss, "{report:?}");
        // The trained parameters load as a model and predict the cycle.
        let m = model_from(&cfg, &report.names, &report.params).unwrap();
        let ids = Array::from_slice(&stream[..13], &[1, 13]).unwrap();
        let logits = m.logits(&ids, None).unwrap().slice_axis(1, 12, 13).unwrap().reshape(&[48]).unwrap();
        let v = logits.to_f32_vec().unwrap();
        let argmax = (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap() as u32;
        assert_eq!(argmax, stream[13]);
    }

    #[test]
    fn bad_streams_are_refused() {
        let cfg = gemma4::config::tiny_dense_config(64, 48, 2).unwrap();
        let tc = TargetTrainConfig { steps: 1, batch: 1, seq_len: 8, eval_windows: 1, ..Default::default() };
        let e = train_target(&cfg, init_params(&cfg, 1).unwrap(), &[5; 5], &[5; 50], &tc, |_| {}).unwrap_err();
        assert!(e.to_string().contains("cannot hold a window of 9"), "{e}");
        let e = train_target(&cfg, init_params(&cfg, 1).unwrap(), &[99; 50], &[5; 50], &tc, |_| {}).unwrap_err();
        assert!(e.to_string().contains("id 99"), "{e}");
    }

    #[test]
    fn small_config_is_a_genuine_gemma4_text_config() {
        let cfg = small_config(4096, 256, 6, 4, 128).unwrap();
        let full: Vec<usize> =
            cfg.layers.iter().enumerate().filter(|(_, l)| l.kind == gemma4::LayerKind::Full).map(|(i, _)| i).collect();
        assert_eq!(full, vec![3, 5], "a full layer every fourth and last");
        assert_eq!(cfg.sliding_window, 128);
        assert!(cfg.tie_word_embeddings && cfg.final_logit_softcapping == Some(30.0));
        assert_eq!((cfg.bos_token_id, cfg.eos_token_ids.clone()), (2, vec![1]));
        let e = small_config(4096, 250, 6, 4, 128).unwrap_err().to_string();
        assert!(e.contains("multiple of heads 4"), "{e}");
        for (h, l, n, w, needle) in [
            (0, 6, 4, 128, "hidden"),
            (256, 0, 4, 128, "layers"),
            (256, 6, 0, 128, "heads"),
            (256, 6, 4, 0, "window"),
            (256, 6, 3, 128, "multiple of heads 3"),
            (24, 1, 6, 128, "multiple of 8"),
        ] {
            let e = small_config(4096, h, l, n, w).unwrap_err().to_string();
            assert!(e.contains(needle), "{h} {l} {n} {w}: {e}");
        }
    }

    #[test]
    fn settings_are_checked_before_training() {
        assert!(TargetTrainConfig::default().validate().is_ok());
        for (tc, field) in [
            (TargetTrainConfig { lr: f64::NAN, ..Default::default() }, "lr"),
            (TargetTrainConfig { lr: 0.0, ..Default::default() }, "lr"),
            (TargetTrainConfig { steps: 0, ..Default::default() }, "steps"),
            (TargetTrainConfig { batch: 0, ..Default::default() }, "batch"),
            (TargetTrainConfig { seq_len: 1, ..Default::default() }, "seq_len"),
            (TargetTrainConfig { clip: f64::INFINITY, ..Default::default() }, "clip"),
        ] {
            let e = tc.validate().unwrap_err().to_string();
            assert!(e.starts_with(field), "{field}: {e}");
        }
        // The training entry point refuses them too, before touching a stream.
        let cfg = gemma4::config::tiny_dense_config(64, 48, 2).unwrap();
        let tc = TargetTrainConfig { lr: f64::NAN, ..Default::default() };
        assert!(train_target(&cfg, init_params(&cfg, 1).unwrap(), &[], &[], &tc, |_| {}).is_err());
    }
}
