//! Writing Gemma-4 checkpoints in the real on-disk formats: random-weight models for tests and
//! the embedded default (gemma4.md §9.1), the MLX-community quantized layout, and the HF naming.
//! Every write goes to a temporary directory that is renamed into place at the end, so an
//! interrupted run never leaves something that looks like a checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_core::quant::{quantize, QuantSpec};
use mlx_core::random::{self, KeyChain};
use mlx_core::{concatenate, Array, Dtype};
use serde_json::{json, Value};

use crate::config::{KvSource, TextConfig};
use crate::error::{Error, Result};

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
    pub name: String,
    pub shape: Vec<i32>,
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

/// A directory being written: files go to `<dir>.tmp-PID` and `commit` renames it into place.
pub struct StagedDir {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl StagedDir {
    /// Starts writing `dest`. With `force`, an existing `dest` is replaced at commit; without
    /// it, an existing non-empty `dest` is refused.
    pub fn new(dest: &Path, force: bool) -> Result<StagedDir> {
        let io = |path: &Path, source| Error::Io { path: path.to_path_buf(), source };
        if dest.exists() && !force {
            let empty = std::fs::read_dir(dest).map_err(|e| io(dest, e))?.next().is_none();
            if !empty {
                return Err(Error::Input {
                    op: "write checkpoint",
                    detail: format!("{} exists and is not empty (use --force to replace it)", dest.display()),
                });
            }
        }
        let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("checkpoint");
        let tmp = dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        for stale in [tmp.clone(), aside(&tmp)] {
            if stale.exists() {
                std::fs::remove_dir_all(&stale).map_err(|e| io(&stale, e))?;
            }
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        Ok(StagedDir { tmp, dest: dest.to_path_buf(), committed: false })
    }

    /// Where to write files now.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished directory into place. A replaced `dest` is first renamed aside and
    /// only deleted once the new one is in place (restored if that rename fails), so at every
    /// moment one complete version exists.
    pub fn commit(mut self) -> Result<PathBuf> {
        let io = |path: &Path, source| Error::Io { path: path.to_path_buf(), source };
        if let Some(parent) = self.dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
        }
        let old = self.dest.exists().then(|| aside(&self.tmp));
        if let Some(old) = &old {
            std::fs::rename(&self.dest, old).map_err(|e| io(&self.dest, e))?;
        }
        if let Err(e) = std::fs::rename(&self.tmp, &self.dest) {
            if let Some(old) = &old {
                let _ = std::fs::rename(old, &self.dest);
            }
            return Err(io(&self.dest, e));
        }
        self.committed = true;
        if let Some(old) = &old {
            // The new output is in place; a leftover hidden copy of the old one is not a failure.
            let _ = std::fs::remove_dir_all(old);
        }
        Ok(self.dest.clone())
    }
}

/// Where `commit` puts a replaced output until the new one is in place.
fn aside(tmp: &Path) -> PathBuf {
    let mut o = tmp.as_os_str().to_os_string();
    o.push(".old");
    PathBuf::from(o)
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes a JSON file.
pub fn write_json(path: &Path, v: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(v).map_err(|source| Error::Json { path: path.to_path_buf(), source })?;
    std::fs::write(path, text + "\n").map_err(|source| Error::Io { path: path.to_path_buf(), source })
}

/// Writes `tensors` (full names) as `shards` safetensors files plus
/// `model.safetensors.index.json`, the way mlx-lm's `save_model` lays them out.
pub fn write_shards(dir: &Path, tensors: &BTreeMap<String, Array>, shards: usize) -> Result<()> {
    let per = tensors.len().div_ceil(shards.max(1)).max(1);
    let mut writer = ShardWriter::new(dir, usize::MAX);
    let items: Vec<(&String, &Array)> = tensors.iter().collect();
    for chunk in items.chunks(per) {
        writer.push(chunk.iter().map(|(n, a)| ((*n).clone(), (*a).clone())).collect())?;
        writer.cut()?;
    }
    writer.finish().map(|_| ())
}

/// A streaming shard writer: tensors are flushed to a shard once `max_bytes` would be
/// exceeded (or at `cut`), so memory holds at most one shard of output (a 7 GB bf16 drafter
/// never sits in memory whole). The finished directory has mlx-lm's layout:
/// `model.safetensors` or `model-0000i-of-0000N.safetensors`, plus
/// `model.safetensors.index.json`; shard metadata `{"format": "mlx"}`.
pub struct ShardWriter {
    dir: PathBuf,
    max_bytes: usize,
    pending: Vec<(String, Array)>,
    pending_bytes: usize,
    /// Flushed parts: temporary file and the tensor names it holds.
    parts: Vec<(PathBuf, Vec<String>)>,
    total_bytes: usize,
}

impl ShardWriter {
    /// Shards of at most `max_bytes` (a single tensor larger than that gets a shard of its own).
    pub fn new(dir: &Path, max_bytes: usize) -> ShardWriter {
        ShardWriter {
            dir: dir.to_path_buf(),
            max_bytes: max_bytes.max(1),
            pending: Vec::new(),
            pending_bytes: 0,
            parts: Vec::new(),
            total_bytes: 0,
        }
    }

    /// Adds tensors that belong together (one source tensor's outputs), ending the current
    /// shard first if they would not fit in it.
    pub fn push(&mut self, tensors: Vec<(String, Array)>) -> Result<()> {
        let bytes: usize = tensors.iter().map(|(_, a)| a.nbytes()).sum();
        if !self.pending.is_empty() && self.pending_bytes.saturating_add(bytes) > self.max_bytes {
            self.cut()?;
        }
        self.pending_bytes += bytes;
        self.total_bytes += bytes;
        self.pending.extend(tensors);
        Ok(())
    }

    /// Ends the current shard (writes it under a temporary name).
    pub fn cut(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let path = self.dir.join(format!(".part-{}.safetensors", self.parts.len()));
        let meta: BTreeMap<String, String> = [("format".to_string(), "mlx".to_string())].into_iter().collect();
        mlx_core::save_safetensors(&path, self.pending.iter().map(|(n, a)| (n.as_str(), a)), &meta)?;
        let names = self.pending.drain(..).map(|(n, _)| n).collect();
        self.parts.push((path, names));
        self.pending_bytes = 0;
        Ok(())
    }

    /// Writes the last shard, gives the parts their final names and writes the index.
    /// Returns (shard count, total tensor bytes).
    pub fn finish(mut self) -> Result<(usize, usize)> {
        self.cut()?;
        let n = self.parts.len();
        let mut weight_map = serde_json::Map::new();
        for (i, (part, names)) in self.parts.iter().enumerate() {
            let file = if n == 1 {
                "model.safetensors".to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            };
            let dest = self.dir.join(&file);
            std::fs::rename(part, &dest).map_err(|source| Error::Io { path: dest.clone(), source })?;
            for name in names {
                weight_map.insert(name.clone(), Value::String(file.clone()));
            }
        }
        let index = json!({"metadata": {"total_size": self.total_bytes}, "weight_map": Value::Object(weight_map)});
        write_json(&self.dir.join("model.safetensors.index.json"), &index)?;
        Ok((n, self.total_bytes))
    }
}

/// A word-level `tokenizer.json` (+ `tokenizer_config.json`): `<pad>` 0, `<eos>` 1, `<bos>` 2,
/// `<unk>` 3, then words `t4 … t{vocab-1}`, whitespace pre-tokenizer.
pub fn write_word_level_tokenizer(dir: &Path, vocab_size: usize) -> Result<()> {
    let special = ["<pad>", "<eos>", "<bos>", "<unk>"];
    let word = |i: usize| if i < special.len() { special[i].to_string() } else { format!("t{i}") };
    let vocab: serde_json::Map<String, Value> = (0..vocab_size).map(|i| (word(i), json!(i))).collect();
    let added: Vec<Value> = special
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": Value::Object(vocab), "unk_token": "<unk>"}
    });
    write_json(&dir.join("tokenizer.json"), &tok)?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 4096}),
    )
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
    let weights = random_weights(cfg, seed, dtype)?;
    let named: BTreeMap<String, Array> = weights.into_iter().map(|(k, v)| (full_name(&k, "model."), v)).collect();
    write_shards(staged.path(), &named, shards)?;
    write_json(&staged.path().join("config.json"), &cfg.to_json_value())?;
    write_word_level_tokenizer(staged.path(), cfg.vocab_size)?;
    staged.commit()
}

/// `lm_head.*` stays at the top level; everything else gets `prefix`.
fn full_name(name: &str, prefix: &str) -> String {
    if name.starts_with("lm_head.") {
        name.to_string()
    } else {
        format!("{prefix}{name}")
    }
}

/// mlx-lm's Gemma-4 quant predicate: `router.proj` is always 8-bit, group 64.
fn module_spec(module: &str, default: QuantSpec) -> Result<QuantSpec> {
    if module.ends_with("router.proj") {
        Ok(QuantSpec::new(8, 64)?)
    } else {
        Ok(default)
    }
}

/// Quantizes a loaded flat checkpoint the way `mlx_lm.convert -q` does: every linear, embedding
/// and switch-expert weight whose input dim divides the group size; norms, scalars and 1-D
/// tensors stay as they are. Writes the same layout with a `quantization` block.
pub fn quantize_checkpoint(src: &Path, dest: &Path, bits: u32, group_size: u32, force: bool) -> Result<PathBuf> {
    let cfg = TextConfig::from_dir(src)?;
    if cfg.quantization.is_some() {
        return Err(Error::Input { op: "quantize", detail: format!("{} is already quantized", src.display()) });
    }
    let default = QuantSpec::new(bits, group_size)?;
    let (tensors, prefix) = crate::weights::sanitize(crate::weights::load_raw(src)?, &cfg)?;
    let mut out = BTreeMap::new();
    let mut block = serde_json::Map::new();
    block.insert("group_size".into(), json!(group_size));
    block.insert("bits".into(), json!(bits));
    block.insert("mode".into(), json!("affine"));
    for (name, w) in tensors {
        let module = name.strip_suffix(".weight").filter(|_| w.ndim() >= 2);
        let full = |n: &str| full_name(n, prefix);
        match module {
            Some(m) => {
                let spec = module_spec(m, default)?;
                let in_dim = w.dim(-1).unwrap_or(0) as u32;
                if !in_dim.is_multiple_of(spec.group_size()) {
                    out.insert(full(&name), w);
                    continue;
                }
                if spec != default {
                    block.insert(full(m), json!({"group_size": spec.group_size(), "bits": spec.bits()}));
                }
                let q = quantize(&w, spec)?;
                out.insert(full(&format!("{m}.weight")), q.weight);
                out.insert(full(&format!("{m}.scales")), q.scales);
                out.insert(full(&format!("{m}.biases")), q.biases);
            }
            None => {
                out.insert(full(&name), w);
            }
        }
    }
    let staged = StagedDir::new(dest, force)?;
    write_shards(staged.path(), &out, 1)?;
    let mut config = read_config_json(src)?;
    if let Value::Object(map) = &mut config {
        map.insert("quantization".into(), Value::Object(block.clone()));
        map.insert("quantization_config".into(), Value::Object(block));
    }
    write_json(&staged.path().join("config.json"), &config)?;
    copy_tokenizer(src, staged.path())?;
    staged.commit()
}

/// Re-expresses a flat bf16 checkpoint in HF naming (`model.language_model.*`, nested
/// `text_config`, fused `experts.gate_up_proj`) with the junk tensors real HF checkpoints carry
/// (a vision tower entry, rotary buffers, stray k/v on KV-shared layers), which sanitize drops.
pub fn write_hf_layout(src: &Path, dest: &Path, force: bool) -> Result<PathBuf> {
    let cfg = TextConfig::from_dir(src)?;
    let (tensors, _) = crate::weights::sanitize(crate::weights::load_raw(src)?, &cfg)?;
    let mut out = BTreeMap::new();
    let lm = "model.language_model.";
    let mut pending_gate: BTreeMap<String, Array> = BTreeMap::new();
    for (name, w) in tensors {
        if let Some(base) = name.strip_suffix(".experts.switch_glu.gate_proj.weight") {
            pending_gate.insert(base.to_string(), w);
        } else if let Some(base) = name.strip_suffix(".experts.switch_glu.up_proj.weight") {
            let gate = pending_gate.remove(base).ok_or_else(|| Error::MissingWeight {
                dir: src.to_path_buf(),
                name: format!("{base}.experts.switch_glu.gate_proj.weight"),
            })?;
            out.insert(format!("{lm}{base}.experts.gate_up_proj"), concatenate(&[&gate, &w], -2)?);
        } else if let Some(base) = name.strip_suffix(".experts.switch_glu.down_proj.weight") {
            out.insert(format!("{lm}{base}.experts.down_proj"), w);
        } else if name.starts_with("lm_head.") {
            out.insert(format!("model.language_model.{name}"), w);
        } else {
            out.insert(format!("{lm}{name}"), w);
        }
    }
    let dtype = out.values().next().map(|a| a.dtype()).unwrap_or(Dtype::Bf16);
    out.insert("model.vision_tower.patch_embed.weight".into(), Array::zeros(&[4, 4], dtype)?);
    out.insert(format!("{lm}layers.0.self_attn.rotary_emb.inv_freq"), Array::zeros(&[4], Dtype::F32)?);
    if let Some(shared) = (cfg.first_kv_shared..cfg.num_hidden_layers).next() {
        let l = &cfg.layers[shared];
        let shape = [(l.n_kv_heads * l.head_dim) as i32, cfg.hidden_size as i32];
        out.insert(format!("{lm}layers.{shared}.self_attn.k_proj.weight"), Array::zeros(&shape, dtype)?);
    }
    let staged = StagedDir::new(dest, force)?;
    write_shards(staged.path(), &out, 2)?;
    let text = cfg.to_json_value();
    let nested = json!({
        "model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text, "vocab_size": cfg.vocab_size, "eos_token_id": cfg.eos_token_ids,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    });
    write_json(&staged.path().join("config.json"), &nested)?;
    copy_tokenizer(src, staged.path())?;
    staged.commit()
}

fn read_config_json(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
    serde_json::from_str(&text).map_err(|source| Error::Json { path, source })
}

fn copy_tokenizer(src: &Path, dst: &Path) -> Result<()> {
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json"] {
        let from = src.join(f);
        if from.is_file() {
            std::fs::copy(&from, dst.join(f)).map_err(|source| Error::Io { path: from.clone(), source })?;
        }
    }
    Ok(())
}
