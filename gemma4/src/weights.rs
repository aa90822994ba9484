//! Checkpoint tensors: shard discovery, mlx-lm's sanitize rules (gemma4.md §4.3) and a
//! `WeightMap` that hands tensors to the model by name, checks shapes, and refuses leftovers
//! (mlx-lm loads with `strict=True`).
//!
//! Names are normalised to the text model's own paths (`layers.0.self_attn.q_proj.weight`,
//! `embed_tokens.weight`, `lm_head.weight`); `module_prefix` keeps the checkpoint's prefix
//! (`model.` or `language_model.model.`) because quantization overrides are keyed by full path.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mlx_core::quant::Quantized;
use mlx_core::{Array, Dtype};

use crate::config::{Layout, QuantizationConfig, TextConfig};
use crate::error::{Error, Result};

const DROPPED_PREFIXES: [&str; 6] =
    ["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
const DROPPED_PARTS: [&str; 5] = ["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"];

/// The `model*.safetensors` shards of a checkpoint directory, in name order. When
/// `model.safetensors.index.json` exists, every shard it names must be present.
pub fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Io { path: dir.to_path_buf(), source })?;
    let mut shards: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            n.starts_with("model") && n.ends_with(".safetensors")
        })
        .collect();
    shards.sort();
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| Error::Io { path: index.clone(), source })?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| Error::Json { path: index.clone(), source })?;
        let listed: BTreeSet<String> = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .map(|m| m.values().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default();
        for shard in listed {
            if !dir.join(&shard).is_file() {
                return Err(Error::MissingShard { dir: dir.to_path_buf(), shard });
            }
        }
    }
    if shards.is_empty() {
        return Err(Error::NoWeights { dir: dir.to_path_buf() });
    }
    Ok(shards)
}

/// Loads every shard (lazily: MLX reads data at first evaluation).
pub fn load_raw(dir: &Path) -> Result<BTreeMap<String, Array>> {
    let mut all: BTreeMap<String, Array> = BTreeMap::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for shard in shard_paths(dir)? {
        let name = shard.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let file = mlx_core::load_safetensors(&shard)?;
        for (k, v) in file.tensors {
            if let Some(first) = origin.get(&k) {
                return Err(Error::DuplicateTensor {
                    dir: dir.to_path_buf(),
                    name: k,
                    first: first.clone(),
                    second: name,
                });
            }
            origin.insert(k.clone(), name.clone());
            all.insert(k, v);
        }
    }
    Ok(all)
}

/// Applies mlx-lm's wrapper and text sanitize rules, returning text-model-relative names and
/// the module prefix the checkpoint's quantization block uses.
pub fn sanitize(raw: BTreeMap<String, Array>, cfg: &TextConfig) -> Result<(BTreeMap<String, Array>, &'static str)> {
    let mut out = BTreeMap::new();
    let prefix = match cfg.layout {
        Layout::Flat => "model.",
        Layout::Nested => "language_model.model.",
    };
    for (key, value) in raw {
        // Wrapper rules (nested layout): strip `model.`, drop multimodal towers, and map
        // `language_model.` to `language_model.model.`; mlx-community keys are already there.
        let key = match cfg.layout {
            Layout::Nested => {
                let (stripped, had_model) = match key.strip_prefix("model.") {
                    Some(s) => (s.to_string(), true),
                    None => (key.clone(), false),
                };
                if DROPPED_PREFIXES.iter().any(|p| stripped.starts_with(p)) {
                    continue;
                }
                let full = if had_model {
                    match stripped.strip_prefix("language_model.") {
                        Some(rest) => format!("language_model.model.{rest}"),
                        None => stripped,
                    }
                } else {
                    stripped
                };
                if let Some(rest) = full.strip_prefix("language_model.model.") {
                    rest.to_string()
                } else if let Some(rest) = full.strip_prefix("language_model.") {
                    rest.to_string() // language_model.lm_head.*
                } else {
                    full
                }
            }
            Layout::Flat => match key.strip_prefix("model.") {
                Some(rest) => rest.to_string(),
                None => key.clone(),
            },
        };
        if DROPPED_PARTS.iter().any(|p| key.contains(p)) {
            continue;
        }
        if [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"].iter().any(|p| key.contains(p)) {
            if let Some(layer) = layer_index(&key) {
                if layer >= cfg.first_kv_shared {
                    continue;
                }
            }
        }
        if let Some(base) = key.strip_suffix(".experts.gate_up_proj") {
            // [E, 2I, H] → gate = first half, up = second half along axis -2.
            let two_i = value.dim(-2).unwrap_or(0);
            let gate = value.slice_axis(-2, 0, two_i / 2)?.contiguous()?;
            let up = value.slice_axis(-2, two_i / 2, two_i)?.contiguous()?;
            out.insert(format!("{base}.experts.switch_glu.gate_proj.weight"), gate);
            out.insert(format!("{base}.experts.switch_glu.up_proj.weight"), up);
            continue;
        }
        if let Some(base) = key.strip_suffix(".experts.down_proj") {
            out.insert(format!("{base}.experts.switch_glu.down_proj.weight"), value);
            continue;
        }
        out.insert(key, value);
    }
    Ok((out, prefix))
}

fn layer_index(key: &str) -> Option<usize> {
    let rest = key.split("layers.").nth(1)?;
    rest.split('.').next()?.parse().ok()
}

/// A linear layer's weights: dense `[out, in]` or MLX-affine quantized.
#[derive(Clone, Debug)]
pub enum LinearWeights {
    Dense(Array),
    Quantized(Quantized),
}

impl LinearWeights {
    /// `x @ Wᵀ` for W `[out, in]`: the `nn.Linear` / tied-head product // `[.., in]` -> `[.., out]`
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            LinearWeights::Dense(w) => x.matmul(&w.transpose(&[1, 0])?)?,
            LinearWeights::Quantized(q) => q.matmul_t(x)?,
        })
    }

    /// Rows at `ids` of a `[rows, dims]` table (quantized: gather, then dequantize) // [..] -> `[.., dims]`
    pub fn gather(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            LinearWeights::Dense(w) => w.take(ids, 0)?,
            LinearWeights::Quantized(q) => {
                let mut shape = ids.shape();
                let rows = q.gather_rows(&ids.reshape(&[-1])?)?;
                shape.push(-1);
                rows.reshape(&shape)?
            }
        })
    }
}

/// Hands out tensors by name and remembers which were taken.
pub struct WeightMap {
    dir: PathBuf,
    tensors: BTreeMap<String, Array>,
    taken: BTreeSet<String>,
    prefix: &'static str,
    quantization: Option<QuantizationConfig>,
}

impl WeightMap {
    /// Loads and sanitizes a checkpoint directory.
    pub fn load(dir: &Path, cfg: &TextConfig) -> Result<WeightMap> {
        let (tensors, prefix) = sanitize(load_raw(dir)?, cfg)?;
        Ok(WeightMap::from_tensors(dir, tensors, prefix, cfg.quantization.clone()))
    }

    /// Wraps already-sanitized tensors (tests, converters).
    pub fn from_tensors(
        dir: &Path,
        tensors: BTreeMap<String, Array>,
        prefix: &'static str,
        quantization: Option<QuantizationConfig>,
    ) -> WeightMap {
        WeightMap { dir: dir.to_path_buf(), tensors, taken: BTreeSet::new(), prefix, quantization }
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Takes a tensor without checking its shape.
    pub fn get(&mut self, name: &str) -> Result<Array> {
        match self.tensors.get(name) {
            Some(a) => {
                self.taken.insert(name.to_string());
                Ok(a.clone())
            }
            None => Err(Error::MissingWeight { dir: self.dir.clone(), name: name.to_string() }),
        }
    }

    /// Takes a tensor and checks its shape.
    pub fn get_shaped(&mut self, name: &str, expected: &[i32]) -> Result<Array> {
        let a = self.get(name)?;
        let got = a.shape();
        if got != expected {
            return Err(Error::WeightShape {
                dir: self.dir.clone(),
                name: name.to_string(),
                expected: expected.to_vec(),
                got,
            });
        }
        Ok(a)
    }

    /// A linear (or embedding table) at module path `module` with logical shape `[out, in]`:
    /// dense if there is no `module.scales`, else quantized with the config's per-path spec or
    /// the spec inferred from shapes (mlx-lm `infer_quant_config`).
    pub fn linear(&mut self, module: &str, out: usize, inp: usize) -> Result<LinearWeights> {
        self.stacked_linear(module, None, out, inp)
    }

    /// Like [`WeightMap::linear`] for a stack of `experts` matrices `[E, out, in]` (switch layers).
    pub fn stacked_linear(
        &mut self,
        module: &str,
        experts: Option<usize>,
        out: usize,
        inp: usize,
    ) -> Result<LinearWeights> {
        let lead: Vec<i32> = experts.iter().map(|&e| e as i32).collect();
        let with_lead = |tail: &[i32]| -> Vec<i32> { lead.iter().chain(tail).copied().collect() };
        let wname = format!("{module}.weight");
        let sname = format!("{module}.scales");
        let full_path = format!("{}{module}", self.prefix);
        let override_spec = self.quantization.as_ref().and_then(|q| q.overrides.get(&full_path).copied());
        let quantized = match override_spec {
            Some(None) => false,
            Some(Some(_)) => true,
            None => self.contains(&sname),
        };
        if !quantized {
            return Ok(LinearWeights::Dense(self.get_shaped(&wname, &with_lead(&[out as i32, inp as i32]))?));
        }
        let weight = self.get(&wname)?;
        let scales = self.get(&sname)?;
        let biases = self.get(&format!("{module}.biases"))?;
        let qerr = |detail: String| Error::Quantization { dir: self.dir.clone(), name: wname.clone(), detail };
        if weight.dtype() != Dtype::U32 {
            return Err(qerr(format!("packed weight has dtype {}, expected uint32", weight.dtype())));
        }
        let (full_ws, full_ss) = (weight.shape(), scales.shape());
        let n = lead.len();
        let lead_ok =
            full_ws.len() == n + 2 && full_ss.len() == n + 2 && full_ws[..n] == lead[..] && full_ss[..n] == lead[..];
        let (ws, ss) = (full_ws[n.min(full_ws.len())..].to_vec(), full_ss[n.min(full_ss.len())..].to_vec());
        if !lead_ok || ws.len() != 2 || ss.len() != 2 || ws[0] != out as i32 || ss[0] != out as i32 || ss[1] <= 0 {
            return Err(qerr(format!(
                "weight {full_ws:?} / scales {full_ss:?} do not fit a {:?} matrix",
                with_lead(&[out as i32, inp as i32])
            )));
        }
        let spec = match override_spec.flatten() {
            Some(s) => s,
            None => {
                let group = inp as i32 / ss[1];
                let bits = ws[1] * 32 / inp as i32;
                crate::config::QuantSpec {
                    group_size: group as u32,
                    bits: bits as u32,
                    mode: crate::config::QuantMode::Affine,
                }
            }
        };
        let spec = mlx_core::quant::QuantSpec::new(spec.bits, spec.group_size).map_err(|e| qerr(e.to_string()))?;
        let expect_w = (inp as u32 * spec.bits() / 32) as i32;
        let expect_s = (inp as u32 / spec.group_size()) as i32;
        if ws[1] != expect_w || ss[1] != expect_s || biases.shape() != full_ss {
            return Err(qerr(format!(
                "weight {full_ws:?}, scales {full_ss:?}, biases {:?} do not match {} bits / group {} for in={inp} (expected weight [{out}, {expect_w}], scales [{out}, {expect_s}])",
                biases.shape(),
                spec.bits(),
                spec.group_size()
            )));
        }
        Ok(LinearWeights::Quantized(Quantized { weight, scales, biases, spec }))
    }

    /// Fails if any tensor was not taken (strict load).
    pub fn finish(self) -> Result<()> {
        let unused: Vec<String> = self.tensors.keys().filter(|k| !self.taken.contains(*k)).cloned().collect();
        if unused.is_empty() {
            return Ok(());
        }
        Err(Error::UnusedWeights { dir: self.dir, count: unused.len(), first: unused.into_iter().take(5).collect() })
    }

    /// The checkpoint directory (for error messages).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
