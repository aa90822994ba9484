//! Random-weight checkpoints: every parameter a config loads, drawn from a seed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::random::{self, KeyChain};
use mlx_core::{Array, Dtype};

use super::full_name;
use super::shards::{write_json, write_shards};
use super::tokenizer::write_word_level_tokenizer;
use crate::config::{KvSource, TextConfig};
use crate::error::Result;
use crate::staging::StagedDir;

/// How a parameter is initialised (random checkpoints draw *everything*: identity norms or
/// scalars would hide missing ops).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// N(0, 1/fan_in), fan_in = last dim.
    Matrix,
    /// 1 + 0.2·N(0, 1).
    Norm,
    /// U(0.5, 1.5).
    Scalar,
}

/// One parameter of the text model, by its text-model-relative name.
#[derive(Clone, Debug)]
pub struct ParamSpec {
    /// Name relative to the text model (e.g. `embed_tokens.weight`, no layout prefix).
    pub name: String,
    /// Shape as loaded.
    pub shape: Vec<i32>,
    /// How `random` fills it.
    pub init: Init,
}

/// Every parameter a model with `cfg` loads, in a stable order.
pub fn param_specs(cfg: &TextConfig) -> Vec<ParamSpec> {
    let mut v = Vec::new();
    let mut add = |name: String, shape: &[usize], init: Init| {
        v.push(ParamSpec { name, shape: shape.iter().map(|&d| d as i32).collect(), init })
    };
    let h = cfg.hidden_size;
    add("embed_tokens.weight".into(), &[cfg.vocab_size, h], Init::Matrix);
    if cfg.has_ple() {
        let w = cfg.num_hidden_layers * cfg.hidden_size_per_layer_input;
        add("embed_tokens_per_layer.weight".into(), &[cfg.vocab_size_per_layer_input, w], Init::Matrix);
        add("per_layer_model_projection.weight".into(), &[w, h], Init::Matrix);
        add("per_layer_projection_norm.weight".into(), &[cfg.hidden_size_per_layer_input], Init::Norm);
    }
    add("norm.weight".into(), &[h], Init::Norm);
    for (i, l) in cfg.layers.iter().enumerate() {
        let p = |n: &str| format!("layers.{i}.{n}");
        for n in
            ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
        {
            add(p(&format!("{n}.weight")), &[h], Init::Norm);
        }
        let (hq, hkv, d) = (l.n_heads, l.n_kv_heads, l.head_dim);
        add(p("self_attn.q_proj.weight"), &[hq * d, h], Init::Matrix);
        add(p("self_attn.o_proj.weight"), &[h, hq * d], Init::Matrix);
        add(p("self_attn.q_norm.weight"), &[d], Init::Norm);
        if matches!(l.kv, KvSource::Own { .. }) {
            add(p("self_attn.k_proj.weight"), &[hkv * d, h], Init::Matrix);
            if l.has_v_proj {
                add(p("self_attn.v_proj.weight"), &[hkv * d, h], Init::Matrix);
            }
            add(p("self_attn.k_norm.weight"), &[d], Init::Norm);
        }
        add(p("mlp.gate_proj.weight"), &[l.mlp_width, h], Init::Matrix);
        add(p("mlp.up_proj.weight"), &[l.mlp_width, h], Init::Matrix);
        add(p("mlp.down_proj.weight"), &[h, l.mlp_width], Init::Matrix);
        if cfg.has_ple() {
            let pw = cfg.hidden_size_per_layer_input;
            add(p("per_layer_input_gate.weight"), &[pw, h], Init::Matrix);
            add(p("per_layer_projection.weight"), &[h, pw], Init::Matrix);
            add(p("post_per_layer_input_norm.weight"), &[h], Init::Norm);
        }
        add(p("layer_scalar"), &[1], Init::Scalar);
        if cfg.enable_moe_block {
            let (e, mi) = (cfg.num_experts.unwrap_or(0), cfg.moe_intermediate_size.unwrap_or(0));
            add(p("router.proj.weight"), &[e, h], Init::Matrix);
            add(p("router.scale"), &[h], Init::Norm);
            add(p("router.per_expert_scale"), &[e], Init::Scalar);
            add(p("experts.switch_glu.gate_proj.weight"), &[e, mi, h], Init::Matrix);
            add(p("experts.switch_glu.up_proj.weight"), &[e, mi, h], Init::Matrix);
            add(p("experts.switch_glu.down_proj.weight"), &[e, h, mi], Init::Matrix);
            for n in ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"] {
                add(p(&format!("{n}.weight")), &[h], Init::Norm);
            }
        }
    }
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), &[cfg.vocab_size, h], Init::Matrix);
    }
    v
}

/// Random weights for `cfg`, seeded, in `dtype` (drawn in f32, then cast).
pub fn random_weights(cfg: &TextConfig, seed: u64, dtype: Dtype) -> Result<BTreeMap<String, Array>> {
    let mut keys = KeyChain::new(seed)?;
    let mut out = BTreeMap::new();
    for spec in param_specs(cfg) {
        let key = keys.next_key()?;
        let a = match spec.init {
            Init::Matrix => {
                let fan_in = *spec.shape.last().unwrap_or(&1) as f32;
                random::normal(&spec.shape, Dtype::F32, 0.0, fan_in.powf(-0.5), &key)?
            }
            Init::Norm => random::normal(&spec.shape, Dtype::F32, 1.0, 0.2, &key)?,
            Init::Scalar => random::uniform(0.5, 1.5, &spec.shape, Dtype::F32, &key)?,
        };
        out.insert(spec.name, a.astype(dtype)?);
    }
    Ok(out)
}

/// Writes `weights` (text-model-relative names, as [`param_specs`] lists them) and `cfg` into
/// `dir` in the flat `gemma4_text` layout (`model.*` names, `config.json`), in `shards` files.
/// The caller stages `dir` (see [`StagedDir`]) and adds the tokenizer.
pub fn write_weights(dir: &Path, cfg: &TextConfig, weights: &BTreeMap<String, Array>, shards: usize) -> Result<()> {
    let named: BTreeMap<String, Array> = weights.iter().map(|(k, v)| (full_name(k, "model."), v.clone())).collect();
    write_shards(dir, &named, shards)?;
    write_json(&dir.join("config.json"), &cfg.to_json_value())
}

/// Writes a random-weight checkpoint for `cfg` in the flat `gemma4_text` layout (`model.*`),
/// with a word-level tokenizer.
pub fn write_random_checkpoint(
    dest: &Path,
    cfg: &TextConfig,
    seed: u64,
    dtype: Dtype,
    shards: usize,
    force: bool,
) -> Result<PathBuf> {
    let staged = StagedDir::new(dest, force)?;
    write_weights(staged.path(), cfg, &random_weights(cfg, seed, dtype)?, shards)?;
    write_word_level_tokenizer(staged.path(), cfg.vocab_size)?;
    staged.commit()
}
