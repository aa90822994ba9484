//! `dspark.json`: the DSpark drafter checkpoint descriptor (format in docs/formats.md).
//!
//! ```json
//! { "kind": "dspark-drafter", "variant": "dspark", "version": 2,
//!   "target_id": "<model>@<hidden>x<vocab>",
//!   "config": { "gamma", "dDraft", "nLayers", "nHeads", "markovRank", "ffMult", "tapLayers",
//!               "seqHead"?, "ctxWindow"?, "confLaw"?, "greedyHead"?,
//!               "sts"?: { "version"?, "thresholds", "target", "samples",
//!                                   "greedy"?: StsFit, "sampled"?: StsFit } },
//!   "dims": { "hiddenSize", "vocabSize", "eps", "numLayers" }, "param_names": [...] }
//! ```
//! Tap index `i < num_hidden_layers` is the residual after layer i; `i == num_hidden_layers` is
//! the post-final-norm hidden. That makes a tap's meaning depend on the target's depth, so
//! version 2 records `numLayers` and the loader requires the target to have exactly that many.

use std::collections::BTreeSet;
use std::path::Path;

use gemma4::{TapPoint, TapSet, TextConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The descriptor's `kind`.
pub const KIND: &str = "dspark-drafter";
/// Variants this crate loads; `"dflash"` is the legacy spelling of the same module.
pub const VARIANTS: [&str; 2] = ["dspark", "dflash"];
/// The descriptor version this crate writes. Version 1 lacks `dims.numLayers`.
pub const FORMAT_VERSION: u32 = 2;

/// The calibration block this crate writes (`config.sts.version`). Version 1 (no `version`
/// key) holds precision thresholds only; version 2 adds sequential temperature scaling fits;
/// version 3 adds their isotonic survival maps (`survivalMaps`).
pub const CALIBRATION_VERSION: u32 = 3;

fn calibration_v1() -> u32 {
    1
}

/// Calibration of the confidence head (`config.sts`): per-position pruning thresholds and,
/// from version 2, the STS temperatures the throughput schedule turns into survivals.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Block format: 1 (thresholds only), 2 (per-mode STS fits) or 3 (survival maps, `eceScaled`).
    #[serde(default = "calibration_v1")]
    pub version: u32,
    /// Pruning threshold on the confidence per block position (γ entries).
    pub thresholds: Vec<f32>,
    /// The precision the thresholds were fitted for: P(accepted given confidence ≥ threshold).
    pub target: f32,
    /// Confidence samples (one per verified draft position) the thresholds were fitted on.
    #[serde(default)]
    pub samples: usize,
    /// STS fitted on greedy runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greedy: Option<StsFit>,
    /// STS fitted on sampled runs (acceptance is lower than under greedy decoding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled: Option<StsFit>,
}

impl StsFit {
    /// The fitted scaling.
    pub fn sts(&self) -> crate::calibration::sts::Sts {
        crate::calibration::sts::Sts {
            temperatures: self.temperatures.clone(),
            shifts: self.shifts.clone(),
            maps: self
                .survival_maps
                .iter()
                .map(|k| crate::calibration::survival_map::SurvivalMap { knots: k.clone() })
                .collect(),
        }
    }
}

impl Calibration {
    /// A version-1 block: thresholds only.
    pub fn thresholds_only(thresholds: Vec<f32>, target: f32, samples: usize) -> Calibration {
        Calibration { version: 1, thresholds, target, samples, greedy: None, sampled: None }
    }

    /// The STS fit for greedy or sampled decoding, if calibrated for it.
    pub fn sts_for(&self, greedy: bool) -> Option<&StsFit> {
        if greedy {
            self.greedy.as_ref()
        } else {
            self.sampled.as_ref()
        }
    }
}

/// One sequential-temperature-scaling fit and how well it calibrates held-out rounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StsFit {
    /// Temperature of the confidence logit per block position.
    pub temperatures: Vec<f32>,
    /// Shift added to the scaled logit per block position (absent: 0, the paper's STS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shifts: Vec<f32>,
    /// Sampling temperature of the runs it was fitted on (0 = greedy).
    pub sampling_temperature: f32,
    /// Verify rounds fitted on.
    pub rounds: usize,
    /// Knots (scaled survival, survival) of each position's isotonic map (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub survival_maps: Vec<Vec<[f32; 2]>>,
    /// Expected calibration error (20 bins) of the survival per position on held-out rounds:
    /// raw, after the temperatures and shifts alone (absent before version 3), and after the
    /// whole calibration.
    pub ece_before: Vec<f32>,
    /// Held-out ECE per position after the temperatures and shifts alone (absent before version 3).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ece_scaled: Vec<f32>,
    /// Held-out ECE per position after the whole calibration.
    pub ece_after: Vec<f32>,
}

/// Module hyper-parameters (`config`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DSparkConfig {
    /// γ: drafts per block.
    pub gamma: usize,
    /// Drafter width D (divisible by `n_heads`).
    pub d_draft: usize,
    /// Backbone layers.
    pub n_layers: usize,
    /// Attention heads per backbone layer.
    pub n_heads: usize,
    /// Rank r of the Markov head (`markov.w1` `[V, r]`).
    pub markov_rank: usize,
    /// MLP width multiplier: F = `ff_mult` · D.
    pub ff_mult: usize,
    /// Target tap indices whose hidden states form H_ctx (`num_layers` = the post-final-norm state).
    pub tap_layers: Vec<usize>,
    /// Sequential head; only `"markov"` is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_head: Option<String>,
    /// Calibration of the confidence head, when calibrated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sts: Option<Calibration>,
    /// The context rows the backbone attends to: the last `ctxWindow` committed rows (training
    /// sets it to the context length it trained with). Absent: the whole context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctx_window: Option<usize>,
    /// The confidence heads also read two facts of the draft law: its top-1 log-probability
    /// and its entropy (`confLaw`). Absent: the paper's head, which reads [h_k; W1[x_{k−1}]].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conf_law: bool,
    /// A second confidence head (`conf_greedy.*`) trained on greedy acceptance (the draft's
    /// argmax equals the target's), used under greedy decoding (`greedyHead`). Absent: greedy
    /// decoding reads the sampled head, which predicts a different event.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub greedy_head: bool,
}

/// Target dimensions the drafter was built for (`dims`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dims {
    /// The target's `hidden_size` H.
    pub hidden_size: usize,
    /// The target's vocabulary size V.
    pub vocab_size: usize,
    /// The drafter's RMSNorm epsilon.
    pub eps: f32,
    /// The target's decoder layer count (version 2; a tap equal to it is the final-norm output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_layers: Option<usize>,
}

/// The whole descriptor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    /// Always `"dspark-drafter"`.
    pub kind: String,
    /// `"dspark"` (or the legacy `"dflash"`); absent on refused v1 checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Descriptor format: 2 is written, 1 and 2 are read.
    pub version: u32,
    /// The target the drafter was trained for, `<model>@<hidden>x<vocab>`.
    pub target_id: String,
    /// Module hyper-parameters.
    pub config: DSparkConfig,
    /// Target dimensions the drafter was built for.
    pub dims: Dims,
    /// Parameter names in order; must equal the list derived from `config`.
    pub param_names: Vec<String>,
    /// MLX affine quantization block (drafter-quant output), mlx-lm layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<Value>,
    /// Where the token embedding and LM head come from: `"target"` (shared with the target;
    /// the only kind this build runs: an own 262k-row head would dominate a drafter's cost).
    /// Absent in older descriptors, which all shared the target's.
    #[serde(default = "target_head")]
    pub head: String,
}

/// The `head` value of a drafter that shares the target's embedding and LM head.
pub const TARGET_HEAD: &str = "target";

fn target_head() -> String {
    TARGET_HEAD.to_string()
}

impl DSparkConfig {
    /// A small module reading `tap_layers` (γ 4, width 64, 2 layers of 4 heads, Markov rank 16,
    /// MLP 2×), to adjust with struct update syntax.
    pub fn with_taps(tap_layers: Vec<usize>) -> DSparkConfig {
        DSparkConfig {
            gamma: 4,
            d_draft: 64,
            n_layers: 2,
            n_heads: 4,
            markov_rank: 16,
            ff_mult: 2,
            tap_layers,
            seq_head: None,
            sts: None,
            ctx_window: None,
            conf_law: false,
            greedy_head: false,
        }
    }

    /// Checks internal consistency.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |d: String| Err(Error::checkpoint(path, d));
        if self.gamma < 1 {
            return bad("config.gamma must be >= 1".into());
        }
        if self.n_heads == 0 || self.d_draft == 0 || !self.d_draft.is_multiple_of(self.n_heads) {
            return bad(format!("config.dDraft {} not divisible by nHeads {}", self.d_draft, self.n_heads));
        }
        if self.n_layers == 0 || self.ff_mult == 0 || self.markov_rank == 0 {
            return bad("config.nLayers, ffMult and markovRank must be >= 1".into());
        }
        if self.tap_layers.is_empty() {
            return bad("config.tapLayers is empty".into());
        }
        if self.ctx_window == Some(0) {
            return bad("config.ctxWindow must be >= 1 (or absent for the whole context)".into());
        }
        match self.seq_head.as_deref() {
            None | Some("markov") => {}
            Some(other) => return bad(format!("config.seqHead {other:?} is not supported (expected \"markov\")")),
        }
        if let Some(s) = &self.sts {
            crate::calibration::check(s, self.gamma).map_err(|d| Error::checkpoint(path, format!("config.{d}")))?;
        }
        Ok(())
    }

    /// Tap points on a target with `num_layers` decoder layers, limited to the prompt rows the
    /// context window reads.
    pub fn tap_set(&self, num_layers: usize) -> TapSet {
        TapSet::new(
            self.tap_layers.iter().map(|&i| if i == num_layers { TapPoint::FinalNorm } else { TapPoint::Layer(i) }),
        )
        .with_window(self.ctx_window)
    }

    /// The canonical parameter order (names double as safetensors keys).
    pub fn param_names(&self) -> Vec<String> {
        let mut v = Vec::new();
        for i in 0..self.n_layers {
            for n in ["attn_norm", "q", "k", "v", "o", "ff_norm", "gate", "up", "down"] {
                v.push(format!("bb.{i}.{n}"));
            }
        }
        for n in [
            "W_c",
            "ctx_norm",
            "tok_proj",
            "mask_emb",
            "block_pos",
            "out_norm",
            "out_proj",
            "markov.w1",
            "markov.w2",
            "conf.w",
            "conf.b",
        ] {
            v.push(n.to_string());
        }
        // Last, so adding the head leaves every other parameter's initial draw unchanged.
        if self.greedy_head {
            v.extend(["conf_greedy.w".to_string(), "conf_greedy.b".to_string()]);
        }
        v
    }

    /// Width of a confidence head's input: [h_k; W1[x_{k−1}]], then the two law features.
    pub fn confidence_inputs(&self) -> usize {
        self.d_draft + self.markov_rank + if self.conf_law { super::confidence::LAW_FEATURES } else { 0 }
    }

    /// Expected shape of each parameter for target `dims` and `m` taps.
    pub fn param_shape(&self, name: &str, dims: &Dims) -> Option<Vec<i32>> {
        let (d, di, r) = (self.d_draft as i32, (self.ff_mult * self.d_draft) as i32, self.markov_rank as i32);
        let (h, v, m, g) =
            (dims.hidden_size as i32, dims.vocab_size as i32, self.tap_layers.len() as i32, self.gamma as i32);
        if let Some(rest) = name.strip_prefix("bb.") {
            let field = rest.split_once('.')?.1;
            return Some(match field {
                "attn_norm" | "ff_norm" => vec![d],
                "q" | "k" | "v" | "o" => vec![d, d],
                "gate" | "up" => vec![d, di],
                "down" => vec![di, d],
                _ => return None,
            });
        }
        Some(match name {
            "W_c" => vec![m * h, d],
            "ctx_norm" | "out_norm" => vec![d],
            "tok_proj" => vec![h, d],
            "mask_emb" => vec![(g - 1).max(1), d],
            "block_pos" => vec![g, d],
            "out_proj" => vec![d, h],
            "markov.w1" => vec![v, r],
            "markov.w2" => vec![r, v],
            "conf.w" | "conf_greedy.w" => vec![self.confidence_inputs() as i32, 1],
            "conf.b" | "conf_greedy.b" => vec![1],
            _ => return None,
        })
    }
}

/// The role of a DSpark parameter, which decides how it may be quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    /// A matmul weight stored `[in, out]` and used as `x @ W` (quantized transposed).
    Matrix,
    /// A gather table whose rows are tokens (`markov.w1`; quantized as stored).
    GatherTable,
    /// The confidence head: kept dense because pruning thresholds are sensitive to it.
    ConfidenceHead,
    /// Norms, embeddings of the block and the like: always dense.
    Other,
}

/// The kind of parameter `name` (one of `DSparkConfig::param_names`).
pub fn param_kind(name: &str) -> ParamKind {
    let layer_field =
        name.strip_prefix("bb.").and_then(|rest| rest.split_once('.')).filter(|(i, _)| i.parse::<usize>().is_ok());
    match (name, layer_field) {
        (_, Some((_, "q" | "k" | "v" | "o" | "gate" | "up" | "down"))) => ParamKind::Matrix,
        ("W_c" | "tok_proj" | "out_proj" | "markov.w2", None) => ParamKind::Matrix,
        ("markov.w1", None) => ParamKind::GatherTable,
        ("conf.w" | "conf.b" | "conf_greedy.w" | "conf_greedy.b", None) => ParamKind::ConfidenceHead,
        _ => ParamKind::Other,
    }
}

/// `<model>@<hidden>x<vocab>`.
pub fn target_id(model_name: &str, target: &TextConfig) -> String {
    format!("{model_name}@{}x{}", target.hidden_size, target.vocab_size)
}

/// Reads and checks `dir/dspark.json`, refusing v1 (single-vector) checkpoints.
pub fn read_descriptor(dir: &Path) -> Result<Descriptor> {
    let path = dir.join("dspark.json");
    if !path.is_file() {
        return Err(Error::checkpoint(dir, "no dspark.json — not a DSpark checkpoint"));
    }
    let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    let raw: Value = serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("invalid JSON: {e}")))?;
    let variant = raw.get("variant").and_then(Value::as_str).map(str::to_string);
    match variant.as_deref() {
        Some(v) if VARIANTS.contains(&v) => {}
        None => {
            return Err(Error::checkpoint(
                dir,
                "a v1 single-vector DSpark checkpoint (no \"variant\") — superseded and not loadable; retrain it as a \
                 v2 (KV-injection, variant \"dspark\") checkpoint",
            ))
        }
        Some(other) => {
            return Err(Error::checkpoint(&path, format!("unknown variant {other:?}, expected one of {VARIANTS:?}")));
        }
    }
    let d: Descriptor = serde_json::from_value(raw).map_err(|e| Error::checkpoint(&path, format!("{e}")))?;
    if d.kind != KIND {
        return Err(Error::checkpoint(&path, format!("kind is {:?}, expected {KIND:?}", d.kind)));
    }
    if !(1..=FORMAT_VERSION).contains(&d.version) {
        return Err(Error::checkpoint(
            &path,
            format!("format version {} is not supported (this build reads 1..={FORMAT_VERSION})", d.version),
        ));
    }
    if d.version >= 2 && d.dims.num_layers.is_none() {
        return Err(Error::checkpoint(&path, "dims.numLayers is missing (required from format version 2)"));
    }
    if !(d.dims.eps.is_finite() && d.dims.eps > 0.0) {
        return Err(Error::checkpoint(&path, format!("dims.eps is {}, expected a finite value > 0", d.dims.eps)));
    }
    if d.head != TARGET_HEAD {
        return Err(Error::checkpoint(
            &path,
            format!("head is {:?}; this build runs only drafters that share the target's embedding and LM head (\"target\")", d.head),
        ));
    }
    d.config.validate(&path)?;
    let derived = d.config.param_names();
    let (listed, wanted): (BTreeSet<&String>, BTreeSet<&String>) =
        (d.param_names.iter().collect(), derived.iter().collect());
    if listed != wanted {
        let differ = listed.symmetric_difference(&wanted).next();
        return Err(Error::checkpoint(
            &path,
            format!(
                "param_names ({} names) do not match the config ({} names; first difference {differ:?}) — the descriptor was edited or is from another build",
                d.param_names.len(),
                derived.len()
            ),
        ));
    }
    Ok(d)
}

/// The `(hidden, vocab)` a [`target_id`] ends with (`name@HxV`), if it has that form.
fn target_id_dims(id: &str) -> Option<(usize, usize)> {
    let (_, dims) = id.rsplit_once('@')?;
    let (h, v) = dims.split_once('x')?;
    Some((h.parse().ok()?, v.parse().ok()?))
}

/// Checks the drafter fits `target`.
pub fn check_target(d: &Descriptor, target: &TextConfig) -> Result<()> {
    let inc = |detail: String| Err(Error::Incompatible { drafter: format!("dspark ({})", d.target_id), detail });
    if d.dims.hidden_size != target.hidden_size {
        return inc(format!("drafter hiddenSize {} vs target hidden_size {}", d.dims.hidden_size, target.hidden_size));
    }
    if d.dims.vocab_size != target.vocab_size {
        return inc(format!("drafter vocabSize {} vs target vocab_size {}", d.dims.vocab_size, target.vocab_size));
    }
    match d.dims.num_layers {
        Some(n) if n != target.num_hidden_layers => {
            return inc(format!(
                "drafter numLayers {n} vs target num_hidden_layers {} (tap indices mean different layers)",
                target.num_hidden_layers
            ));
        }
        // Version 1 did not record the depth: a tap equal to the target's layer count would mean
        // "final norm" only if the drafter was built for this depth, which cannot be checked.
        None if d.config.tap_layers.contains(&target.num_hidden_layers) => {
            return inc(format!(
                "a version-1 checkpoint taps index {} (the final norm of a {}-layer target) but does not record the \
                 depth it was built for; re-save it with this version",
                target.num_hidden_layers, target.num_hidden_layers
            ));
        }
        _ => {}
    }
    // `target_id` records the shape of the target the drafter was built for ("name@HxV"); a
    // descriptor whose id names another shape than its own dims was edited or mixed up.
    if let Some((h, v)) = target_id_dims(&d.target_id) {
        if (h, v) != (target.hidden_size, target.vocab_size) {
            return inc(format!(
                "targetId {:?} names a target of hidden size {h} and vocabulary {v}; this target has hidden_size {} \
                 and vocab_size {}",
                d.target_id, target.hidden_size, target.vocab_size
            ));
        }
    }
    if let Some(&bad) = d.config.tap_layers.iter().find(|&&t| t > target.num_hidden_layers) {
        return inc(format!(
            "tap layer {bad} out of range for a {}-layer target (valid: 0..={}, {} = post-norm)",
            target.num_hidden_layers, target.num_hidden_layers, target.num_hidden_layers
        ));
    }
    Ok(())
}

/// Writes calibrated thresholds into `dir/dspark.json` (`config.sts`), atomically. Refuses to
/// overwrite an existing calibration unless `force`.
pub fn write_calibration(dir: &Path, calibration: &Calibration, force: bool) -> Result<()> {
    let path = dir.join("dspark.json");
    let d = read_descriptor(dir)?;
    if calibration.thresholds.len() != d.config.gamma {
        return Err(Error::checkpoint(
            &path,
            format!("{} thresholds for a block of {}", calibration.thresholds.len(), d.config.gamma),
        ));
    }
    if let (Some(old), false) = (&d.config.sts, force) {
        return Err(Error::checkpoint(
            &path,
            format!(
                "already has calibrated thresholds (target={}, samples={}); replacing them must be forced",
                old.target, old.samples
            ),
        ));
    }
    let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    let mut v: Value =
        serde_json::from_str(&text).map_err(|e| Error::checkpoint(&path, format!("invalid JSON: {e}")))?;
    v["config"]["sts"] = serde_json::to_value(calibration).map_err(|e| Error::Contract(e.to_string()))?;
    let body = serde_json::to_string_pretty(&v).map_err(|e| Error::Contract(e.to_string()))? + "\n";
    mlx_core::files::write_atomic(&path, body.as_bytes()).map_err(|source| Error::Io { path: path.clone(), source })
}
