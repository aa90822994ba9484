//! The load smoke: reload the written checkpoint through the drafter loader (the same code that
//! serves it), project one context row and run one full greedy draft round on a target, and
//! check the shapes. A wrong spec or layout fails here, not at serve time.
//!
//! A drafter fits only the target it was trained for, so the target is either the caller's
//! (`Smoke::Target`) or, when the drafter's dims are gemma4's tiny config A, a random tiny
//! model built in memory (`Smoke::Auto`). For any other drafter `Auto` still reloads every
//! tensor through the loader (against a weightless config of the drafter's own target dims)
//! and projects one context row; only the draft round, which needs the real target's
//! embeddings and head, is left to `--smoke-target`.

use std::path::{Path, PathBuf};

use gemma4::checkpoint::random_weights;
use gemma4::config::{tiny_config_a, tiny_dense_config};
use gemma4::weights::WeightMap;
use gemma4::Model;
use mlx_core::{Array, Dtype};
use spec_decode::loader::{load_drafter, target_shape};
use spec_decode::{DraftRequest, DraftSampling, Drafter, Proposal};

use crate::error::{Error, Result};

/// Which target the load smoke runs on.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Smoke {
    /// No smoke.
    Off,
    /// The tiny random target if the drafter fits gemma4's tiny config A, else a reload and
    /// one context-projection row (warning that the round needs the target).
    #[default]
    Auto,
    /// The drafter's real target checkpoint.
    Target(PathBuf),
}

/// What the smoke did.
#[derive(Clone, Debug, PartialEq)]
pub enum SmokeOutcome {
    /// One round drafted `drafts` tokens with `[drafts, vocab]` logits on `target`.
    Passed {
        /// Name of the target the round ran on (its directory, or the built-in tiny config).
        target: String,
        /// Drafts proposed (the drafter's γ).
        drafts: usize,
        /// The target's vocabulary size.
        vocab: usize,
    },
    /// Reloaded through the loader and projected one context row; no draft round (no target).
    ContextOnly {
        /// Why no round was drafted.
        reason: String,
    },
    /// No smoke ran.
    Skipped {
        /// Why (e.g. `disabled`).
        reason: String,
    },
}

/// The two-token prompt of the smoke: the first token's tapped row seeds the context, the
/// second is the anchor.
const PROMPT: [u32; 2] = [2, 5];

/// A random bf16 model with gemma4's tiny config A, built in memory.
pub fn tiny_target(seed: u64) -> gemma4::Result<Model> {
    let cfg = tiny_config_a();
    let weights = random_weights(&cfg, seed, Dtype::Bf16)?;
    let mut wm = WeightMap::from_tensors(Path::new("<tiny target A>"), weights, "model.", None);
    let model = Model::from_weights(cfg, &mut wm)?;
    wm.finish()?;
    Ok(model)
}

/// One draft round: `reset` with the tapped row of `PROMPT[0]` (one context-projection row),
/// then a greedy `propose` of γ drafts after `PROMPT[1]`.
pub fn draft_round(drafter: &mut dyn Drafter, target: &Model) -> spec_decode::Result<Proposal> {
    let mut cache = target.new_cache();
    let taps = drafter.taps();
    let ids = gemma4::generate::ids_array(&PROMPT[..1])?;
    let rows = if taps.is_empty() {
        target.forward(&ids, Some(&mut cache))?;
        None
    } else {
        target.forward_tapped(&ids, Some(&mut cache), &taps)?.taps
    };
    drafter.reset(rows.as_ref(), 1)?;
    let anchor = Array::from_slice(&PROMPT[1..], &[1])?;
    drafter.propose(DraftRequest {
        anchor: &anchor,
        position: 1,
        max_drafts: drafter.gamma(),
        sampling: DraftSampling::Greedy,
        target,
        target_cache: &cache,
    })
}

/// Reloads the drafter in `dir` (every tensor through the loader's name, shape and quantization
/// checks) and projects one zero context row into it.
fn context_smoke(dir: &Path) -> spec_decode::Result<()> {
    let shape = target_shape(dir)?;
    // A weightless target config of the drafter's own target dims: enough for the loader.
    let target = tiny_dense_config(shape.hidden_size, shape.vocab_size, shape.num_hidden_layers)
        .map_err(|e| spec_decode::Error::Contract(format!("the drafter's target dims make no valid config: {e}")))?;
    let mut drafter = load_drafter(dir, &target)?;
    let width = (drafter.taps().points().len() * shape.hidden_size) as i32;
    let row = Array::zeros(&[1, 1, width], Dtype::Bf16)?; // [1, 1, taps·H]
    drafter.reset(Some(&row), 1)?;
    if drafter.context_len() != 1 {
        return Err(spec_decode::Error::Contract(format!(
            "context holds {} rows after projecting one",
            drafter.context_len()
        )));
    }
    Ok(())
}

/// Runs the smoke on the checkpoint at `dir`; errors name `report_as` (the final output path).
pub(crate) fn run(dir: &Path, report_as: &Path, smoke: &Smoke, warn: &mut dyn FnMut(String)) -> Result<SmokeOutcome> {
    let fail = |stage: &'static str| {
        move |source: spec_decode::Error| Error::Smoke {
            path: report_as.to_path_buf(),
            stage,
            source: Box::new(source),
        }
    };
    let (target, mut drafter, name) = match smoke {
        Smoke::Off => return Ok(SmokeOutcome::Skipped { reason: "disabled".into() }),
        Smoke::Target(t) => {
            let target = Model::load(t).map_err(|e| fail("loading the smoke target")(e.into()))?;
            let drafter = load_drafter(dir, target.config()).map_err(fail("reloading the drafter"))?;
            (target, drafter, t.display().to_string())
        }
        Smoke::Auto => match load_drafter(dir, &tiny_config_a()) {
            Err(spec_decode::Error::Incompatible { detail, .. }) => {
                context_smoke(dir).map_err(fail("reloading the drafter and projecting one context row"))?;
                let reason = format!(
                    "reloaded and projected one context row; the drafter was built for another target ({detail}), so \
                     the draft round needs that target as the smoke target"
                );
                warn(format!("load smoke: {reason}"));
                return Ok(SmokeOutcome::ContextOnly { reason });
            }
            Err(e) => return Err(fail("reloading the drafter")(e)),
            Ok(d) => (
                tiny_target(0).map_err(|e| fail("building the tiny target")(e.into()))?,
                d,
                "tiny config A".to_string(),
            ),
        },
    };
    let p = draft_round(drafter.as_mut(), &target).map_err(fail("drafting one round"))?;
    let (d, v) = (drafter.gamma(), target.config().vocab_size);
    let check = |what: &str, got: Vec<i32>, want: Vec<i32>| {
        if got == want {
            Ok(())
        } else {
            Err(Error::SmokeCheck {
                path: report_as.to_path_buf(),
                what: format!("{what} have shape {got:?}, expected {want:?}"),
            })
        }
    };
    check("draft tokens", p.tokens.shape()?, vec![d as i32])?;
    let logits = p
        .logits
        .as_ref()
        .ok_or_else(|| Error::SmokeCheck { path: report_as.to_path_buf(), what: "no draft logits".into() })?;
    check("draft logits", logits.shape()?, vec![d as i32, v as i32])?;
    let values = logits.to_f32_vec()?;
    if let Some(i) = values.iter().position(|x| !x.is_finite()) {
        return Err(Error::SmokeCheck {
            path: report_as.to_path_buf(),
            what: format!("draft logit {i} is {}", values[i]),
        });
    }
    Ok(SmokeOutcome::Passed { target: name, drafts: d, vocab: v })
}
