//! DeepSpec-format drafters (DeepSeek `Gemma4DSparkModel` checkpoints; format in
//! docs/formats.md, "DeepSpec drafters").
//!
//! A 5-layer Gemma-4-shaped transformer reads the target's tapped hidden states
//! (`target_layer_ids`, tap `TapPoint::Layer(id)` = DeepSpec's `hidden_states[id + 1]`) as
//! read-only context K/V and drafts a block `[anchor, mask × (γ−1)]` bidirectionally in one
//! forward; a vanilla Markov head then walks the block left to right.
//!
//! Invariants:
//! - Loading is strict (every checkpoint tensor consumed, shapes checked) and sharding-aware;
//!   quantized siblings load through gemma4's `WeightMap` (`.scales` sibling + config entry).
//! - The context K/V cache holds exactly the committed rows, projected once (see `context`).
//! - `propose` reads nothing back to the host: the block is built with `concatenate` and the
//!   Markov token chain stays on the device (argmax / categorical feed the next gather).
//! - Step logits `base[k] + markov_w2(markov_w1[prev])` are summed in the model dtype (bf16),
//!   and confidence is `σ(f32(proj([h_k; markov_w1[prev_k]]) + bias))` (docs/numerics.md,
//!   "DeepSpec drafter numerics"). The returned `logits` are these step logits in f32 — the
//!   distribution each draft was drawn from, Markov bias included — never the pre-Markov base
//!   logits.
//! - The drafter never prunes and never returns 0 drafts: d = min(max_drafts, γ) ≥ 1.

mod config;
mod context;
mod model;
#[cfg(feature = "testing")]
pub(crate) mod synthetic;

use std::path::Path;

use gemma4::weights::WeightMap;
use gemma4::{TapPoint, TapSet, TextConfig};
use mlx_core::{concatenate, Array, Dtype};

pub use crate::drafters::context_cache::LayerKv;
pub use config::{DeepSpecConfig, RopeKind, ARCHITECTURE};
pub use context::ContextKv;

use crate::drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
use crate::error::{Error, Result};
use model::DeepSpecModel;

/// The backbone output of one block, before the Markov walk.
#[derive(Clone, Debug)]
pub struct Block {
    /// Post-final-norm hidden of the block rows // `[1, γ, H]` model dtype
    pub hidden: Array,
    /// `softcap(lm_head(hidden))`, **pre-Markov** // `[1, γ, V]` model dtype
    pub base_logits: Array,
}

/// A loaded DeepSpec checkpoint plus the current request's context K/V.
pub struct DeepSpecDrafter {
    model: DeepSpecModel,
    ctx: Option<ContextKv>,
    /// `dspark calibrate`'s output for this checkpoint (its sidecar file), if any.
    calibration: Option<crate::drafters::dspark::Calibration>,
}

impl DeepSpecDrafter {
    /// Loads `dir` (config.json + `model*.safetensors`, optionally sharded with an index) and
    /// checks that it fits `target` (depth, hidden size, vocabulary, tap layers).
    pub fn load(dir: &Path, target: &TextConfig) -> Result<DeepSpecDrafter> {
        Self::load_as(dir, target, false)
    }

    /// [`DeepSpecDrafter::load`], dequantizing quantized weights at load when `dequantize`.
    pub fn load_as(dir: &Path, target: &TextConfig, dequantize: bool) -> Result<DeepSpecDrafter> {
        let cfg = DeepSpecConfig::from_dir(dir)?;
        check_fits(dir, &cfg, target)?;
        let tensors = gemma4::weights::load_raw(dir)?;
        check_quantized_entries(dir, &cfg, tensors.keys())?;
        if let Some(fc) = tensors.get("fc.weight").filter(|_| !tensors.contains_key("fc.scales")) {
            if fc.ndim()? == 2 && fc.dim(1)? != cfg.context_width() as i32 {
                return Err(incompatible(
                    dir,
                    format!(
                        "fc.weight takes {} features, but target_layer_ids lists {} taps × hidden {} = {}",
                        fc.dim(1)?,
                        cfg.target_layer_ids.len(),
                        cfg.hidden_size,
                        cfg.context_width()
                    ),
                ));
            }
        }
        let mut wm = WeightMap::from_tensors(dir, tensors, "", cfg.quantization.clone());
        if dequantize {
            wm.set_conversion(gemma4::compute::Conversion { cast: None, dequantize: true });
        }
        let model = DeepSpecModel::from_weights(cfg, &mut wm)?;
        wm.finish()?;
        let calibration = crate::calibration::read_sidecar(dir, model.cfg.block_size)?;
        Ok(DeepSpecDrafter { model, ctx: None, calibration })
    }

    /// The parsed config.
    pub fn config(&self) -> &DeepSpecConfig {
        &self.model.cfg
    }

    /// The activation dtype (bf16 for released checkpoints).
    pub fn dtype(&self) -> Dtype {
        self.model.dtype
    }

    /// The committed context K/V, if a request is active.
    pub fn context(&self) -> Option<&ContextKv> {
        self.ctx.as_ref()
    }

    /// `hidden_norm(fc(rows))` // `[1, L, taps·H]` -> `[1, L, H]` (also the quantization load smoke).
    pub fn project_context(&self, rows: &Array) -> Result<Array> {
        self.model.project_context(rows)
    }

    /// Runs the backbone on `[anchor, mask × (γ−1)]` at positions `position..position+γ`
    /// against the committed context.
    pub fn draft_block(&mut self, anchor: &Array, position: usize) -> Result<Block> {
        let g = self.model.cfg.block_size;
        if anchor.size()? != 1 {
            return Err(Error::Contract(format!(
                "deepspec: the anchor must be one token, got shape {:?}",
                anchor.shape()?
            )));
        }
        let anchor = anchor.reshape(&[1])?.astype(Dtype::U32)?; // [1]
        let ids = if g > 1 {
            let mask = Array::full(&[g as i32 - 1], self.model.cfg.mask_token_id as f64, Dtype::U32)?;
            concatenate(&[&anchor, &mask], 0)?
        } else {
            anchor
        };
        let ctx = active(&mut self.ctx, position)?;
        let hidden = self.model.backbone(&ids.reshape(&[1, g as i32])?, ctx, position)?; // [1, γ, H]
        let base_logits = self.model.logits(&hidden)?; // [1, γ, V]
        Ok(Block { hidden, base_logits })
    }

    /// Drafts `min(max_drafts, γ)` tokens after `anchor` // `[1]` uint32 at `position` (must
    /// equal the committed context length).
    pub fn draft(
        &mut self,
        anchor: &Array,
        position: usize,
        max_drafts: usize,
        sampling: DraftSampling<'_>,
    ) -> Result<Proposal> {
        if max_drafts == 0 {
            return Err(Error::Settings {
                field: "max_drafts",
                detail: "must be ≥ 1 (a drafter never proposes 0 drafts)".into(),
            });
        }
        let block = self.draft_block(anchor, position)?;
        let (h, v) = (self.model.cfg.hidden_size as i32, self.model.cfg.vocab_size as i32);
        let n = max_drafts.min(self.model.cfg.block_size);
        let mut sampling = sampling;
        let uniforms = sampling.uniforms(n)?; // [n] under sampling
        let mut prev = anchor.reshape(&[1])?.astype(Dtype::U32)?; // [1]
        let (mut tokens, mut logits, mut qs, mut conf) =
            (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for k in 0..n as i32 {
            let base_k = block.base_logits.slice_axis(1, k, k + 1)?.reshape(&[1, v])?; // [1, V]
            let e1 = self.model.markov.as_ref().map(|m| m.w1.forward(&prev)).transpose()?; // [1, r]
            let step = match (&self.model.markov, &e1) {
                (Some(m), Some(e)) => base_k.add(&m.w2.forward(e)?)?, // summed in bf16 (docs/numerics.md)
                _ => base_k,
            };
            let step32 = step.astype(Dtype::F32)?;
            let tok = match sampling.draw_at(&step32, uniforms.as_ref(), k as usize)? {
                Some((t, q)) => {
                    qs.push(q);
                    t
                }
                None => step.argmax(-1, false)?.astype(Dtype::U32)?,
            }; // [1]
            if let Some(c) = &self.model.confidence {
                let h_k = block.hidden.slice_axis(1, k, k + 1)?.reshape(&[1, h])?; // [1, H]
                let input = match (&e1, self.model.cfg.confidence_head_with_markov) {
                    (Some(e), true) => concatenate(&[&h_k, e], -1)?, // [1, H + r]
                    _ => h_k,
                };
                let z = c.proj.forward(&input)?.add(&c.bias)?; // [1, 1] model dtype
                conf.push(z.astype(Dtype::F32)?.sigmoid()?.reshape(&[1])?);
            }
            logits.push(step32);
            tokens.push(tok.clone());
            prev = tok;
        }
        let cat = |xs: &[Array]| -> Result<Array> { Ok(concatenate(xs, 0)?) };
        Ok(Proposal {
            tokens: cat(&tokens)?,                                              // [d] u32
            logits: Some(cat(&logits)?),                                        // [d, V] f32
            q: if qs.is_empty() { None } else { Some(cat(&qs)?) },              // [d, V] f32
            confidence: if conf.is_empty() { None } else { Some(cat(&conf)?) }, // [d] f32
        })
    }
}

/// The request's context, checked to end right before the anchor at `position`.
fn active(ctx: &mut Option<ContextKv>, position: usize) -> Result<&mut ContextKv> {
    let ctx = ctx.as_mut().ok_or_else(|| Error::Contract("deepspec: propose before reset".into()))?;
    if position != ctx.len() {
        return Err(Error::Contract(format!(
            "deepspec: anchor position {position} != committed context length {} (the anchor's row is never in the context)",
            ctx.len()
        )));
    }
    Ok(ctx)
}

impl Drafter for DeepSpecDrafter {
    fn name(&self) -> String {
        "deepspec".into()
    }

    fn gamma(&self) -> usize {
        self.model.cfg.block_size
    }

    fn taps(&self) -> TapSet {
        // HF `hidden_states[lid + 1]`: the residual after layer lid, except that the last entry
        // (lid = num_target_layers − 1) is taken after the final norm.
        let last = self.model.cfg.num_target_layers.saturating_sub(1);
        TapSet::new(self.model.cfg.target_layer_ids.iter().map(|&l| {
            if l == last {
                TapPoint::FinalNorm
            } else {
                TapPoint::Layer(l)
            }
        }))
    }

    fn has_confidence(&self) -> bool {
        self.model.confidence.is_some()
    }

    /// Calibrated thresholds when `dspark calibrate` has run on the checkpoint, else
    /// DeepSpec's `confidence_threshold` (absent in released configs) as per-position
    /// thresholds; position 0 is never pruned in our loop, so its threshold is 0.
    fn thresholds(&self) -> Option<Vec<f32>> {
        if let Some(c) = &self.calibration {
            return Some(c.thresholds.clone());
        }
        let (t, g) = (self.model.cfg.confidence_threshold, self.model.cfg.block_size);
        (t > 0.0 && self.model.confidence.is_some()).then(|| (0..g).map(|k| if k == 0 { 0.0 } else { t }).collect())
    }

    fn sts(&self, greedy: bool) -> Option<crate::calibration::sts::Sts> {
        self.calibration.as_ref().and_then(|c| c.sts_for(greedy)).map(crate::drafters::dspark::StsFit::sts)
    }

    fn reset(&mut self, ctx: Option<&Array>, len: usize) -> Result<()> {
        self.ctx = None;
        let rows = ctx.ok_or_else(|| {
            Error::Contract("deepspec reset: the drafter reads tapped target context, got none".into())
        })?;
        let mut fresh = ContextKv::new(self.model.cfg.num_hidden_layers);
        fresh.append(context::project_rows(&self.model, rows, len, 0, "reset")?, len)?;
        self.ctx = Some(fresh);
        Ok(())
    }

    fn context_len(&self) -> usize {
        self.ctx.as_ref().map_or(0, ContextKv::len)
    }

    fn propose(&mut self, req: DraftRequest<'_>) -> Result<Proposal> {
        self.draft(req.anchor, req.position, req.max_drafts, req.sampling)
    }

    fn commit(&mut self, rows: Option<&Array>, k: usize) -> Result<()> {
        let rows = rows.ok_or_else(|| Error::Contract("deepspec commit: missing tapped rows".into()))?;
        let ctx = self.ctx.as_mut().ok_or_else(|| Error::Contract("deepspec: commit before reset".into()))?;
        ctx.append(context::project_rows(&self.model, rows, k, ctx.len(), "commit")?, k)
    }
}

fn incompatible(dir: &Path, detail: String) -> Error {
    Error::Incompatible { drafter: format!("deepspec ({})", dir.display()), detail }
}

/// Depth, hidden size, vocabulary and tap layers against the live target.
fn check_fits(dir: &Path, cfg: &DeepSpecConfig, target: &TextConfig) -> Result<()> {
    if cfg.num_target_layers != target.num_hidden_layers {
        return Err(incompatible(
            dir,
            format!(
                "num_target_layers: DeepSpec drafter was trained for a {}-layer target; this model has {} layers — wrong (target, drafter) pairing",
                cfg.num_target_layers, target.num_hidden_layers
            ),
        ));
    }
    if cfg.hidden_size != target.hidden_size {
        return Err(incompatible(
            dir,
            format!("hidden_size {} != target hidden_size {}", cfg.hidden_size, target.hidden_size),
        ));
    }
    if cfg.vocab_size != target.vocab_size {
        return Err(incompatible(
            dir,
            format!("vocab_size {} != target vocab_size {}", cfg.vocab_size, target.vocab_size),
        ));
    }
    if let Some(&bad) = cfg.target_layer_ids.iter().find(|&&id| id >= target.num_hidden_layers) {
        return Err(incompatible(
            dir,
            format!("target_layer_ids: layer {bad} is out of range for a {}-layer target", target.num_hidden_layers),
        ));
    }
    Ok(())
}

/// A `.scales` sibling needs a quantization config entry, a default or its own (docs/formats.md,
/// "MLX affine quantization").
fn check_quantized_entries<'a>(
    dir: &Path,
    cfg: &DeepSpecConfig,
    names: impl Iterator<Item = &'a String>,
) -> Result<()> {
    for base in names.filter_map(|n| n.strip_suffix(".scales")) {
        let covered = cfg.quantization.as_ref().is_some_and(|q| q.default.is_some() || q.overrides.contains_key(base));
        if !covered {
            return Err(Error::checkpoint(
                &config::config_path(dir),
                format!("{base} has quantized tensors (.scales sibling) but no quantization config entry"),
            ));
        }
    }
    Ok(())
}
