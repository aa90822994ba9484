//! A drafter fitted by counting, with no gradient training: the Markov head is set to the
//! target's own next-token statistics (bigrams of its greedy continuations), and the backbone's
//! contribution is switched off (out_proj = 0, so the shared head adds the same logits to every
//! token). It is a real DSpark checkpoint in the real format — the embedded default ships one so
//! speculative decoding shows real acceptances out of the box. Trained drafters replace it.

use std::collections::BTreeMap;

use gemma4::generate::{generate, GenerateConfig};
use gemma4::Model;
use mlx_core::{Array, Dtype};

use super::config::DSparkConfig;
use super::model::DSparkDrafter;
use crate::error::{Error, Result};

/// Fits a bigram DSpark drafter for `target` from greedy continuations of `prompts`.
pub fn fit_bigram_drafter(
    target: &Model,
    model_name: &str,
    prompts: &[Vec<u32>],
    tokens: usize,
    gamma: usize,
) -> Result<DSparkDrafter> {
    let v = target.config().vocab_size;
    if v > 4096 {
        return Err(Error::Settings {
            field: "vocab",
            detail: format!("a bigram table for a vocabulary of {v} is too large; train a drafter instead"),
        });
    }
    // Add-one smoothing, plus a prior on repeating the previous token: greedy continuations
    // of small models loop, and a repeat is the best guess for a pair never seen.
    let mut counts = vec![1.0f32; v * v];
    for a in 0..v {
        counts[a * v + a] += 8.0;
    }
    let cfg_gen = GenerateConfig { max_tokens: tokens, ..Default::default() };
    for p in prompts {
        let out = generate(target, p, &cfg_gen, |_| {})?;
        let seq: Vec<u32> = p.iter().chain(out.tokens.iter()).copied().collect();
        for w in seq.windows(2) {
            counts[w[0] as usize * v + w[1] as usize] += 10.0;
        }
    }
    // W2[prev] = log P(next | prev); W1 = identity, so B_k = W1[x_{k−1}]·W2 is that row.
    let mut logp = vec![0f32; v * v];
    for a in 0..v {
        let row = &counts[a * v..(a + 1) * v];
        let z: f32 = row.iter().sum();
        for b in 0..v {
            logp[a * v + b] = (row[b] / z).ln();
        }
    }
    // Confidence c_k = σ(w·[h_k; W1[x_{k−1}]] + b) with W1 = identity: the token part of w is,
    // per previous token, the log-odds that the bigram's best guess is right.
    let mut conf_w = vec![0f32; 32 + v];
    for a in 0..v {
        let best = (0..v).map(|b| logp[a * v + b]).fold(f32::NEG_INFINITY, f32::max).exp().clamp(1e-4, 1.0 - 1e-4);
        conf_w[32 + a] = (best / (1.0 - best)).ln();
    }
    let mut eye = vec![0f32; v * v];
    for i in 0..v {
        eye[i * v + i] = 1.0;
    }
    let n = target.config().num_hidden_layers;
    let cfg = DSparkConfig {
        gamma,
        d_draft: 32,
        n_layers: 1,
        n_heads: 2,
        markov_rank: v,
        ff_mult: 2,
        tap_layers: vec![n],
        seq_head: None,
        sts: None,
        ctx_window: None,
        conf_law: false,
        greedy_head: false,
    };
    let d = DSparkDrafter::init(cfg, target.config(), model_name, 0, false)?;
    let h = target.config().hidden_size as i32;
    let updates = BTreeMap::from([
        ("markov.w1".to_string(), Array::from_slice(&eye, &[v as i32, v as i32])?),
        ("markov.w2".to_string(), Array::from_slice(&logp, &[v as i32, v as i32])?),
        ("out_proj".to_string(), Array::zeros(&[32, h], Dtype::F32)?),
        ("conf.w".to_string(), Array::from_slice(&conf_w, &[32 + v as i32, 1])?),
    ]);
    d.with_params(updates)
}
