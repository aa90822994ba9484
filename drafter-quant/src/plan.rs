//! Reading the source checkpoint and deciding, tensor by tensor, what gets written.
//!
//! DeepSpec (HF `[out, in]` linears): every 2-D `<module>.weight` is quantized along
//! its last axis — all projections, `fc`, `lm_head`, `markov_head.markov_w2` and the gather
//! tables `embed_tokens`, `markov_head.markov_w1` — except `confidence_head.*`, which is kept
//! and written as a `false` entry. DSpark (f32, `[in, out]`): the matmul parameters are
//! quantized transposed (so the packed matrix is `[out, in]`), the gather table `markov.w1` as
//! stored; `conf.w` / `conf.b` get `false` entries. Everything else passes through unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mlx_core::{Array, Dtype};
use serde_json::Value;
use spec_decode::deepspec::{DeepSpecConfig, ARCHITECTURE};
use spec_decode::dspark::{param_kind, ParamKind};
use spec_decode::loader::{detect, DrafterKind};

use crate::error::{io, Error, Result};

/// DeepSpec modules under this prefix are kept dense by policy.
const DEEPSPEC_DENSE_PREFIX: &str = "confidence_head.";

/// A source checkpoint, opened lazily (tensor data is read when evaluated).
pub(crate) struct Source {
    pub kind: DrafterKind,
    /// `config.json` (DeepSpec) or `dspark.json` (DSpark).
    pub config_file: &'static str,
    pub config: Value,
    pub tensors: BTreeMap<String, Array>,
}

/// What happens to one source tensor.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Action {
    /// Cast to bf16, transpose if asked, quantize along the last axis in groups of
    /// `group_size`, write `module.weight` (packed) / `module.scales` / `module.biases`.
    Quantize { module: String, transpose: bool, group_size: u32 },
    /// Written unchanged under its own name.
    Keep,
}

/// The per-tensor decisions plus the modules recorded as `false` in the quantization block.
pub(crate) struct Plan {
    pub entries: Vec<(String, Action)>,
    pub dense_modules: BTreeSet<String>,
    /// Modules quantized with another group size than asked (recorded as overrides).
    pub group_overrides: BTreeMap<String, u32>,
    /// What the plan changed from the request, in words, for the user.
    pub notes: Vec<String>,
}

/// Opens `src`, refusing anything but an unquantized DeepSpec or DSpark checkpoint.
pub(crate) fn open(src: &Path) -> Result<Source> {
    let kind = detect(src).map_err(|e| not_a_drafter(src, e))?;
    let config_file = match kind {
        DrafterKind::DeepSpec => "config.json",
        DrafterKind::DSpark => "dspark.json",
    };
    let config = read_json(&src.join(config_file))?;
    for key in ["quantization", "quantization_config"] {
        if config.get(key).is_some_and(|v| !v.is_null()) {
            return Err(Error::AlreadyQuantized {
                path: src.to_path_buf(),
                evidence: format!("{config_file} has a {key:?} block"),
            });
        }
    }
    match kind {
        DrafterKind::DeepSpec => drop(DeepSpecConfig::from_dir(src).map_err(spec_decode::Error::from)?),
        DrafterKind::DSpark => drop(spec_decode::dspark::config::read_descriptor(src)?),
    }
    let tensors = gemma4::weights::load_raw(src)?;
    let packed = tensors.iter().find(|(n, a)| n.ends_with(".scales") || a.dtype() == Dtype::U32);
    if let Some((name, _)) = packed {
        return Err(Error::AlreadyQuantized {
            path: src.to_path_buf(),
            evidence: format!("it has the packed tensor {name:?}"),
        });
    }
    Ok(Source { kind, config_file, config, tensors })
}

/// Decides every tensor's fate. A matrix whose quantized axis the requested group size does not
/// divide is quantized with the largest smaller supported group that divides it (an override
/// in the quantization block), or kept dense (a `false` entry) when none does; each such
/// choice is noted, never silent.
pub(crate) fn plan(src: &Source, path: &Path, group_size: u32) -> Result<Plan> {
    let mut entries = Vec::with_capacity(src.tensors.len());
    let mut dense_modules = BTreeSet::new();
    for (name, a) in &src.tensors {
        let action = match src.kind {
            DrafterKind::DeepSpec => deepspec_action(name, a, &mut dense_modules, group_size)?,
            DrafterKind::DSpark => dspark_action(name, a, path, group_size)?,
        };
        entries.push((name.clone(), action));
    }
    if src.kind == DrafterKind::DSpark {
        dense_modules.extend(src.tensors.keys().filter(|n| param_kind(n) == ParamKind::ConfidenceHead).cloned());
    }
    let mut group_overrides = BTreeMap::new();
    let mut notes = Vec::new();
    for (name, act) in &mut entries {
        let Action::Quantize { module, transpose, group_size: g } = act else { continue };
        let a = &src.tensors[name.as_str()];
        let axis_len = a.dim(if *transpose { 0 } else { -1 })?;
        if axis_len % group_size as i32 == 0 {
            continue;
        }
        let fallback = mlx_core::quant::SUPPORTED_GROUP_SIZES
            .iter()
            .rev()
            .copied()
            .find(|&c| c < group_size && axis_len % c as i32 == 0);
        let shape = a.shape()?;
        match fallback {
            Some(c) => {
                notes.push(format!(
                    "{name} {shape:?}: group size {group_size} does not divide its {axis_len}-element axis; quantized \
                     with group size {c}"
                ));
                group_overrides.insert(module.clone(), c);
                *g = c;
            }
            None => {
                notes.push(format!(
                    "{name} {shape:?}: no supported group size up to {group_size} divides its {axis_len}-element \
                     axis; kept unquantized"
                ));
                dense_modules.insert(module.clone());
                *act = Action::Keep;
            }
        }
    }
    Ok(Plan { entries, dense_modules, group_overrides, notes })
}

fn deepspec_action(name: &str, a: &Array, dense: &mut BTreeSet<String>, group_size: u32) -> Result<Action> {
    if name.starts_with(DEEPSPEC_DENSE_PREFIX) {
        if let Some((module, _)) = name.rsplit_once('.') {
            dense.insert(module.to_string());
        }
        return Ok(Action::Keep);
    }
    Ok(match name.strip_suffix(".weight") {
        Some(module) if a.ndim()? == 2 => Action::Quantize { module: module.to_string(), transpose: false, group_size },
        _ => Action::Keep,
    })
}

fn dspark_action(name: &str, a: &Array, path: &Path, group_size: u32) -> Result<Action> {
    let transpose = match param_kind(name) {
        ParamKind::Matrix => true,
        ParamKind::GatherTable => false,
        ParamKind::ConfidenceHead | ParamKind::Other => return Ok(Action::Keep),
    };
    if a.ndim()? != 2 {
        return Err(Error::NotMatrix { path: path.to_path_buf(), tensor: name.to_string(), shape: a.shape()? });
    }
    Ok(Action::Quantize { module: name.to_string(), transpose, group_size })
}

/// Maps a detection failure to "target model" (pointing at the target quantizer) or
/// "not a drafter" (naming what was found).
fn not_a_drafter(src: &Path, e: spec_decode::Error) -> Error {
    let config = src.join("config.json");
    if let Ok(v) = read_json(&config) {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
        if model_type.starts_with("gemma4") && arch != Some(ARCHITECTURE) {
            return Error::TargetModel { path: src.to_path_buf(), model_type: model_type.to_string() };
        }
    }
    let detail = match e {
        spec_decode::Error::Checkpoint { detail, .. } => detail,
        other => other.to_string(),
    };
    Error::NotDrafter { path: src.to_path_buf(), detail }
}

pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = mlx_core::files::read_text(path, mlx_core::files::JSON_LIMIT).map_err(io(path))?;
    serde_json::from_str(&text).map_err(|source| Error::Json { path: path.to_path_buf(), source })
}
