//! One entry point for drafter checkpoints: detects the kind from the files, loads it, and
//! checks it fits the target (hidden size, vocabulary, tap layers, depth).
//!
//! - `dspark.json` → a DSpark drafter (v1 single-vector checkpoints are refused with the reason);
//! - `config.json` with `architectures[0] == "Gemma4DSparkModel"` → a DeepSpec drafter;
//! - anything else is refused, naming what was found (a target model gets pointed elsewhere).

use std::path::Path;

use gemma4::TextConfig;
use serde_json::Value;

use crate::drafter::Drafter;
use crate::drafters::deepspec::{DeepSpecDrafter, ARCHITECTURE};
use crate::drafters::dspark::DSparkDrafter;
use crate::error::{Error, Result};

/// The checkpoint kinds this crate loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrafterKind {
    /// A DSpark drafter (`dspark.json` + safetensors), built in this crate.
    DSpark,
    /// A DeepSpec drafter (HF `config.json` + safetensors).
    DeepSpec,
}

/// Detects the kind of the checkpoint in `dir` from its files.
pub fn detect(dir: &Path) -> Result<DrafterKind> {
    if !dir.is_dir() {
        return Err(Error::checkpoint(dir, "not a directory"));
    }
    if dir.join("dspark.json").is_file() {
        return Ok(DrafterKind::DSpark);
    }
    let config = dir.join("config.json");
    if !config.is_file() {
        return Err(Error::checkpoint(
            dir,
            "neither dspark.json (DSpark) nor config.json (DeepSpec) found — not a drafter checkpoint",
        ));
    }
    let text = mlx_core::files::read_text(&config, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: config.clone(), source })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(&config, format!("invalid JSON: {e}")))?;
    let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    if arch == Some(ARCHITECTURE) {
        return Ok(DrafterKind::DeepSpec);
    }
    let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    let hint = if model_type.starts_with("gemma4") {
        format!(" — it is a Gemma-4 target model (model_type {model_type:?}), not a drafter")
    } else {
        String::new()
    };
    Err(Error::checkpoint(
        &config,
        format!("architectures[0] is {arch:?}, expected {ARCHITECTURE:?} for a DeepSpec drafter (model_type {model_type:?}){hint}"),
    ))
}

/// The target dimensions a drafter checkpoint was built for, from its config alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TargetShape {
    /// The target's `hidden_size` H.
    pub hidden_size: usize,
    /// The target's vocabulary size V.
    pub vocab_size: usize,
    /// The fewest target layers its taps allow (DeepSpec: exactly its target's depth).
    pub num_hidden_layers: usize,
}

/// Reads what target the drafter in `dir` expects (no weights are read).
pub fn target_shape(dir: &Path) -> Result<TargetShape> {
    Ok(match detect(dir)? {
        DrafterKind::DSpark => {
            let d = crate::drafters::dspark::config::read_descriptor(dir)?;
            // A tap equal to the layer count is the post-norm hidden, so the deepest tap bounds it.
            let layers = d.config.tap_layers.iter().copied().max().unwrap_or(1).max(1);
            TargetShape { hidden_size: d.dims.hidden_size, vocab_size: d.dims.vocab_size, num_hidden_layers: layers }
        }
        DrafterKind::DeepSpec => {
            let c = crate::drafters::deepspec::DeepSpecConfig::from_dir(dir)?;
            TargetShape { hidden_size: c.hidden_size, vocab_size: c.vocab_size, num_hidden_layers: c.num_target_layers }
        }
    })
}

/// Loads the drafter in `dir` for `target`: a DSpark checkpoint (`dspark.json`) or a DeepSpec
/// one (`config.json` with `architectures: ["Gemma4DSparkModel"]`), dense or quantized. A
/// drafter built for another target (hidden size, vocabulary, depth, taps) is refused.
///
/// ```no_run
/// # use std::path::Path;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let target = gemma4::Model::load(Path::new("gemma-4-e2b-it"))?;
/// let drafter = spec_decode::load_drafter(Path::new("gemma-4-e2b-it-dspark"), target.config())?;
/// println!("{} proposes up to {} drafts per round", drafter.name(), drafter.gamma());
/// # Ok(())
/// # }
/// ```
pub fn load_drafter(dir: &Path, target: &TextConfig) -> Result<Box<dyn Drafter>> {
    load_drafter_as(dir, target, false)
}

/// [`load_drafter`], with quantized weights dequantized at load when `dequantize` (what the
/// target's `--dtype auto` does on the CPU, where MLX's quantized matmul is slower than a dense
/// one: a quantized drafter ran at 0.76–0.82× the speed of its f32 original there). A DSpark
/// drafter's dense weights are f32, a DeepSpec one's keep the scales' dtype.
pub fn load_drafter_as(dir: &Path, target: &TextConfig, dequantize: bool) -> Result<Box<dyn Drafter>> {
    Ok(match detect(dir)? {
        DrafterKind::DSpark => Box::new(DSparkDrafter::load_as(dir, target, dequantize)?),
        DrafterKind::DeepSpec => Box::new(DeepSpecDrafter::load_as(dir, target, dequantize)?),
    })
}

/// Whether the drafter checkpoint in `dir` already holds a calibration.
pub fn is_calibrated(dir: &Path) -> Result<bool> {
    Ok(match detect(dir)? {
        DrafterKind::DSpark => crate::drafters::dspark::config::read_descriptor(dir)?.config.sts.is_some(),
        DrafterKind::DeepSpec => dir.join(crate::calibration::SIDECAR_FILE).is_file(),
    })
}

/// Stores `calibration` in the drafter checkpoint in `dir`, replacing any earlier one:
/// `config.sts` of `dspark.json` for DSpark, the sidecar file for DeepSpec.
pub fn write_calibration(dir: &Path, calibration: &crate::drafters::dspark::Calibration) -> Result<()> {
    match detect(dir)? {
        DrafterKind::DSpark => crate::drafters::dspark::write_calibration(dir, calibration, true),
        DrafterKind::DeepSpec => crate::calibration::write_sidecar(dir, calibration),
    }
}
