//! Tiny random-weight DeepSpec checkpoints in the real on-disk format (docs/formats.md,
//! "DeepSpec drafters"), for tests: HF `[out, in]` linears, bf16 tensors with no key prefix, a `config.json` carrying every
//! key the reader consumes, sized to a target's hidden size, vocabulary and depth.
//!
//! Init (seeded, one key per tensor in `param_specs` order): matrices and gather tables
//! N(0, 1/fan_in) with fan_in = last dim, norms 1 + 0.2·N(0, 1), `layer_scalar` U(0.5, 1.5),
//! the confidence head N(0, 0.02). Writes are atomic (staged directory renamed into place).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_json, write_shards, StagedDir};
use gemma4::TextConfig;
use mlx_core::random::{self, KeyChain};
use mlx_core::Dtype;
use serde_json::json;

use super::config::ARCHITECTURE;
use crate::error::{Error, Result};

/// Shape knobs of a synthetic checkpoint (hidden size, vocabulary and target depth come from
/// the target config).
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticDeepSpec {
    /// Drafter layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// `num_global_key_value_heads`.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// γ: rows per block.
    pub block_size: usize,
    /// 0 = no Markov head.
    pub markov_rank: usize,
    /// Token id of the masked block rows.
    pub mask_token_id: u32,
    /// Target layers tapped, in feature order.
    pub target_layer_ids: Vec<usize>,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Fraction of `head_dim` that rotates (proportional RoPE).
    pub partial_rotary_factor: f64,
    /// RoPE base frequency θ.
    pub rope_theta: f64,
    /// Tanh softcap on the draft logits; `None` for none.
    pub softcap: Option<f32>,
    /// Seed of the random weights.
    pub seed: u64,
    /// Writes `confidence_head.proj` (input `[h; markov_w1[prev]]` when markov_rank > 0).
    pub confidence_head: bool,
    /// Number of safetensors shards (> 1 writes `model-0000i-of-0000N`).
    pub shards: usize,
}

impl Default for SyntheticDeepSpec {
    /// Sized for gemma4's tiny config A (hidden 128, 6 layers, vocab 512).
    fn default() -> Self {
        SyntheticDeepSpec {
            layers: 2,
            heads: 4,
            kv_heads: 1,
            head_dim: 32,
            block_size: 5,
            markov_rank: 16,
            mask_token_id: 4,
            target_layer_ids: vec![1, 3, 5],
            intermediate_size: 256,
            partial_rotary_factor: 0.25,
            rope_theta: 1e6,
            softcap: Some(30.0),
            seed: 0,
            confidence_head: true,
            shards: 1,
        }
    }
}

#[derive(Clone, Copy)]
enum Init {
    Matrix,
    Norm,
    Scalar,
    Confidence,
}

/// Every checkpoint tensor (name, shape, init) for these options, in a stable order.
fn param_specs(h: usize, v: usize, o: &SyntheticDeepSpec) -> Vec<(String, Vec<usize>, Init)> {
    let (nh, nkv, hd, inter) = (o.heads, o.kv_heads, o.head_dim, o.intermediate_size);
    let mut out = vec![
        ("embed_tokens.weight".to_string(), vec![v, h], Init::Matrix),
        ("fc.weight".to_string(), vec![h, o.target_layer_ids.len() * h], Init::Matrix),
        ("hidden_norm.weight".to_string(), vec![h], Init::Norm),
        ("norm.weight".to_string(), vec![h], Init::Norm),
        ("lm_head.weight".to_string(), vec![v, h], Init::Matrix),
    ];
    for i in 0..o.layers {
        let p = |n: &str| format!("layers.{i}.{n}");
        out.extend([
            (p("self_attn.q_proj.weight"), vec![nh * hd, h], Init::Matrix),
            (p("self_attn.k_proj.weight"), vec![nkv * hd, h], Init::Matrix),
            (p("self_attn.o_proj.weight"), vec![h, nh * hd], Init::Matrix),
            (p("self_attn.q_norm.weight"), vec![hd], Init::Norm),
            (p("self_attn.k_norm.weight"), vec![hd], Init::Norm),
            (p("input_layernorm.weight"), vec![h], Init::Norm),
            (p("post_attention_layernorm.weight"), vec![h], Init::Norm),
            (p("pre_feedforward_layernorm.weight"), vec![h], Init::Norm),
            (p("post_feedforward_layernorm.weight"), vec![h], Init::Norm),
            (p("mlp.gate_proj.weight"), vec![inter, h], Init::Matrix),
            (p("mlp.up_proj.weight"), vec![inter, h], Init::Matrix),
            (p("mlp.down_proj.weight"), vec![h, inter], Init::Matrix),
            (p("layer_scalar"), vec![1], Init::Scalar),
        ]);
    }
    if o.markov_rank > 0 {
        out.push(("markov_head.markov_w1.weight".into(), vec![v, o.markov_rank], Init::Matrix));
        out.push(("markov_head.markov_w2.weight".into(), vec![v, o.markov_rank], Init::Matrix));
    }
    if o.confidence_head {
        out.push(("confidence_head.proj.weight".into(), vec![1, h + o.markov_rank], Init::Confidence));
        out.push(("confidence_head.proj.bias".into(), vec![1], Init::Confidence));
    }
    out
}

/// The config.json of these options against `target`.
fn config_json(target: &TextConfig, o: &SyntheticDeepSpec) -> serde_json::Value {
    json!({
        "architectures": [ARCHITECTURE],
        "model_type": "gemma4_dspark",
        "torch_dtype": "bfloat16",
        "hidden_size": target.hidden_size,
        "num_hidden_layers": o.layers,
        "num_attention_heads": o.heads,
        "global_head_dim": o.head_dim,
        "num_global_key_value_heads": o.kv_heads,
        "attention_k_eq_v": true,
        "intermediate_size": o.intermediate_size,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": target.rms_norm_eps,
        "final_logit_softcapping": o.softcap,
        "vocab_size": target.vocab_size,
        "block_size": o.block_size,
        "mask_token_id": o.mask_token_id,
        "target_layer_ids": o.target_layer_ids,
        "num_target_layers": target.num_hidden_layers,
        "markov_rank": o.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": o.confidence_head,
        "confidence_head_with_markov": o.confidence_head && o.markov_rank > 0,
        "rope_parameters": {"full_attention": {
            "rope_type": "proportional",
            "rope_theta": o.rope_theta,
            "partial_rotary_factor": o.partial_rotary_factor,
        }},
    })
}

/// Writes a random-weight DeepSpec checkpoint for `target` to `dest` (replacing it).
pub fn write_synthetic_deepspec(dest: &Path, target: &TextConfig, opts: &SyntheticDeepSpec) -> Result<PathBuf> {
    if opts.layers == 0 || opts.heads == 0 || opts.kv_heads == 0 || opts.head_dim == 0 || opts.block_size == 0 {
        return Err(Error::Settings {
            field: "SyntheticDeepSpec",
            detail: "layers, heads, kv_heads, head_dim and block_size must be > 0".into(),
        });
    }
    let (h, v) = (target.hidden_size, target.vocab_size);
    let mut keys = KeyChain::new(opts.seed)?;
    let mut tensors = BTreeMap::new();
    for (name, shape, init) in param_specs(h, v, opts) {
        let shape: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let key = keys.next_key()?;
        let a = match init {
            Init::Matrix => {
                let fan_in = *shape.last().unwrap_or(&1) as f32;
                random::normal(&shape, Dtype::F32, 0.0, fan_in.powf(-0.5), &key)?
            }
            Init::Norm => random::normal(&shape, Dtype::F32, 1.0, 0.2, &key)?,
            Init::Scalar => random::uniform(0.5, 1.5, &shape, Dtype::F32, &key)?,
            Init::Confidence => random::normal(&shape, Dtype::F32, 0.0, 0.02, &key)?,
        };
        tensors.insert(name, a.astype(Dtype::Bf16)?);
    }
    let staged = StagedDir::new(dest, true)?;
    write_shards(staged.path(), &tensors, opts.shards)?;
    write_json(&staged.path().join("config.json"), &config_json(target, opts))?;
    Ok(staged.commit()?)
}
