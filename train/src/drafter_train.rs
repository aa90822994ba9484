//! Training a DSpark drafter against a frozen target on regenerated shards.
//!
//! Shards split by index into train / validation / test (the last tenth is the test slice and
//! is never read here; the tenth before it validates). Each step draws a batch of anchors from
//! one training shard, takes the loss's gradient through MLX, clips it, and applies AdamW on a
//! warmup + cosine schedule. Every `eval_every` steps the same validation batches (drawn with
//! their own RNG, so evaluating never changes what training draws) give the analytic τ; the
//! best drafter so far is saved as a loadable checkpoint, and the whole training state
//! (parameters, moments, step, both RNGs) is saved for `resume`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use gemma4::Model;
use mlx_core::random::KeyChain;
use mlx_core::{value_and_grad, Array};
use spec_decode::dspark::train::{dspark_loss, forward_train, LossTerms, LossWeights, TrainBatch};
use spec_decode::dspark::DSparkDrafter;

use crate::adamw::{AdamW, AdamWConfig};
use crate::analytic::EvalSum;
use crate::clip::clip_global_norm;
use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::sampler::sample_batch;
use crate::schedule::WarmupCosine;
use crate::shards::{list_shards, read_shard, Shard, TargetId};
use crate::state::TrainState;

/// Settings of a drafter training run.
#[derive(Clone, Debug)]
pub struct DrafterTrainConfig {
    /// Total optimizer steps; the learning-rate schedule spans them.
    pub steps: u64,
    /// Anchors per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps before the cosine decay.
    pub warmup: u64,
    /// Context rows before each anchor (older rows are cut, as a bounded inference context is).
    pub max_ctx: usize,
    /// Seed of the batch sampler and of the evaluation batches.
    pub seed: u64,
    /// Steps between evaluations (the last step is always evaluated).
    pub eval_every: u64,
    /// Validation batches per evaluation (the same ones every time).
    pub eval_batches: usize,
    /// Global gradient-norm limit.
    pub clip: f64,
    /// AdamW's decoupled weight decay λ.
    pub weight_decay: f64,
    /// Weights of the CE, L1 and confidence-BCE loss terms.
    pub loss: LossWeights,
    /// Stop after this step as an interrupted run would (the schedule still spans `steps`);
    /// the state saved at the last evaluation resumes it.
    pub stop_after: Option<u64>,
}

impl Default for DrafterTrainConfig {
    fn default() -> Self {
        DrafterTrainConfig {
            steps: 1000,
            batch: 16,
            lr: 3e-3,
            warmup: 50,
            max_ctx: 256,
            seed: 0,
            eval_every: 100,
            eval_batches: 8,
            clip: 1.0,
            weight_decay: 0.0,
            loss: LossWeights::default(),
            stop_after: None,
        }
    }
}

/// Shards by role.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Shards trained on.
    pub train: Vec<PathBuf>,
    /// Validation shards (evaluations, best checkpoint).
    pub val: Vec<PathBuf>,
    /// Held-out test shards, never read by training.
    pub test: Vec<PathBuf>,
}

/// Splits sorted shards: the last tenth (at least one) is the test slice, the tenth before it
/// validation, the rest training. Needs three shards.
pub fn split_shards(shards: &[PathBuf], data_dir: &Path) -> Result<Split> {
    let n = shards.len();
    if n < 3 {
        return Err(Error::State {
            path: data_dir.to_path_buf(),
            detail: format!("{n} shard(s): training needs at least 3 (train, validation and a held-out test slice)"),
        });
    }
    let k = (n / 10).max(1);
    Ok(Split {
        train: shards[..n - 2 * k].to_vec(),
        val: shards[n - 2 * k..n - k].to_vec(),
        test: shards[n - k..].to_vec(),
    })
}

/// Analytic acceptance on the validation batches.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Mean analytic τ: 1 + Σ_j Π_{i≤j} a_i, the expected tokens per round.
    pub tau: f64,
    /// Teacher-forced greedy τ: 1 + the leading drafts whose argmax is the target's.
    pub greedy_tau: f64,
    /// Mean acceptance per block position.
    pub acceptance: Vec<f64>,
    /// Mean validation loss.
    pub loss: f64,
}

/// What a step reports.
#[derive(Clone, Debug)]
pub struct Progress {
    /// This step, 1-based.
    pub step: u64,
    /// Total steps of the run.
    pub steps: u64,
    /// The step's total loss.
    pub loss: f64,
    /// Its cross-entropy term.
    pub ce: f64,
    /// Its L1 (target-law distance) term.
    pub tv: f64,
    /// Its confidence BCE term.
    pub bce: f64,
    /// The greedy head's BCE (0 without one).
    pub bce_greedy: f64,
    /// Learning rate of the step.
    pub lr: f64,
    /// Training anchors per second since this run started.
    pub anchors_per_s: f64,
    /// Estimated seconds to the last step.
    pub eta_s: f64,
    /// The evaluation, on steps that ran one.
    pub eval: Option<EvalReport>,
}

/// The outcome of a run.
#[derive(Clone, Debug)]
pub struct TrainReport {
    /// Optimizer steps taken in all (a resumed run counts the earlier ones).
    pub steps: u64,
    /// Training loss of this run's first step.
    pub first_loss: f64,
    /// Training loss of its last step.
    pub last_loss: f64,
    /// Validation before the first step of this run (the starting drafter's analytic τ).
    pub initial: EvalReport,
    /// The best validation of the run, when one beat the starting τ (saved to `best_dir`).
    pub best: Option<EvalReport>,
    /// `<out>/best`: the drafter checkpoint with the best validation τ.
    pub best_dir: PathBuf,
    /// Training anchors per second over the run.
    pub anchors_per_s: f64,
}

fn scalar(a: &Array) -> Result<f64> {
    Ok(f64::from(a.to_f32_vec()?.first().copied().unwrap_or(f32::NAN)))
}

struct Run<'a> {
    target: &'a Model,
    drafter: &'a DSparkDrafter,
    cfg: &'a DrafterTrainConfig,
}

impl Run<'_> {
    fn terms(&self, params: &[Array], batch: &TrainBatch) -> spec_decode::Result<LossTerms> {
        let d = self.drafter;
        let f = forward_train(d.config(), d.dims(), params, self.target, batch)?;
        dspark_loss(&f, self.target, batch, &self.cfg.loss)
    }

    fn evaluate(&self, params: &[Array], val: &[Shard]) -> Result<EvalReport> {
        // The same batches at every evaluation, from an RNG of their own.
        let mut rng = SplitMix64::new(self.cfg.seed ^ 0x5eed_e7a1);
        let mut sum = EvalSum::new(self.drafter.config().gamma);
        for _ in 0..self.cfg.eval_batches {
            let shard = &val[rng.below(val.len() as u64) as usize];
            let b = sample_batch(shard, self.cfg.batch, self.drafter.config().gamma, self.cfg.max_ctx, &mut rng)?;
            sum.add(&self.terms(params, &b)?, 1.0)?;
        }
        Ok(sum.mean())
    }
}

/// Trains `init` (a dense DSpark drafter for `target`) on the shards in `data_dirs`, writing
/// `<out>/best` and `<out>/state`. With `resume`, continues from `<out>/state`.
///
/// Several data directories (say the target's greedy and its sampled continuations of the same
/// prompts) are split one by one and their slices pooled, so each directory keeps its own
/// held-out test slice and training draws from every one of them.
pub fn train_drafter(
    target: &Model,
    init: &DSparkDrafter,
    data_dirs: &[PathBuf],
    out: &Path,
    cfg: &DrafterTrainConfig,
    resume: bool,
    mut on_progress: impl FnMut(&Progress),
) -> Result<TrainReport> {
    let tcfg = target.config();
    let taps = init.config().tap_layers.clone();
    if taps.last() != Some(&tcfg.num_hidden_layers) {
        return Err(Error::Mismatch {
            what: "taps",
            detail: format!(
                "the drafter's taps are {taps:?}; training needs the final-norm output ({}) last, to compute p^t",
                tcfg.num_hidden_layers
            ),
        });
    }
    if data_dirs.is_empty() {
        return Err(Error::Mismatch { what: "data", detail: "no data directory was given".into() });
    }
    let mut split = Split { train: Vec::new(), val: Vec::new(), test: Vec::new() };
    for dir in data_dirs {
        let shards = list_shards(dir, Some((&TargetId::of(tcfg), &taps)))?;
        let s = split_shards(&shards, dir)?;
        split.train.extend(s.train);
        split.val.extend(s.val);
        split.test.extend(s.test);
    }
    let load = |ps: &[PathBuf]| ps.iter().map(|p| read_shard(p)).collect::<Result<Vec<_>>>();
    let (train_shards, val_shards) = (load(&split.train)?, load(&split.val)?);
    let names = init.config().param_names();
    let _lock = crate::lock::DirLock::acquire(out, "train")?;
    let state_dir = out.join("state");
    let mut state = if resume {
        let s = TrainState::load(&state_dir)?;
        if s.names != names {
            return Err(Error::State {
                path: state_dir.join("state.json"),
                detail: "the saved parameters are not this drafter's (another configuration)".into(),
            });
        }
        s
    } else {
        let params = init.trainable_params()?;
        let opt = AdamW::new(AdamWConfig { weight_decay: cfg.weight_decay, ..Default::default() }, &params)?;
        TrainState {
            names: names.clone(),
            params,
            opt,
            rng: KeyChain::new(cfg.seed)?.state().clone(),
            extra: serde_json::json!({ "sampler_rng": cfg.seed, "best_tau": null }),
        }
    };
    let mut rng = SplitMix64::new(state.extra["sampler_rng"].as_u64().unwrap_or(cfg.seed));
    let mut best: Option<EvalReport> = None;
    let best_tau = state.extra["best_tau"].as_f64();
    let run = Run { target, drafter: init, cfg };
    let sched = WarmupCosine::new(cfg.lr, cfg.warmup, cfg.steps);
    let argnums: Vec<usize> = (0..state.params.len()).collect();
    let gamma = init.config().gamma;
    let (mut first_loss, mut last_loss) = (f64::NAN, f64::NAN);
    let initial = run.evaluate(&state.params, &val_shards)?;
    let t0 = Instant::now();
    let start_step = state.opt.step;
    while state.opt.step < cfg.steps {
        let shard = &train_shards[rng.below(train_shards.len() as u64) as usize];
        let batch = sample_batch(shard, cfg.batch, gamma, cfg.max_ctx, &mut rng)?;
        let f = |xs: &[Array]| -> spec_decode::Result<Vec<Array>> {
            let t = run.terms(xs, &batch)?;
            Ok(vec![t.total, t.ce, t.tv, t.bce, t.bce_greedy])
        };
        let (values, grads) = value_and_grad(f, &state.params, &argnums)?;
        let (grads, _) = clip_global_norm(&grads, cfg.clip)?;
        let lr = sched.lr(state.opt.step);
        state.params = state.opt.step(&state.params, &grads, lr)?;
        let mut all: Vec<&Array> = state.params.iter().chain(&values).collect();
        all.extend(state.opt.state_arrays());
        mlx_core::eval(&all)?;
        let loss = scalar(&values[0])?;
        if !loss.is_finite() {
            return Err(Error::Mismatch {
                what: "training",
                detail: format!("loss is {loss} at step {}", state.opt.step),
            });
        }
        if first_loss.is_nan() {
            first_loss = loss;
        }
        last_loss = loss;
        let step = state.opt.step;
        let done = (step - start_step) as f64;
        let anchors_per_s = done * cfg.batch as f64 / t0.elapsed().as_secs_f64().max(1e-9);
        let eval = if step % cfg.eval_every.max(1) == 0 || step == cfg.steps {
            let e = run.evaluate(&state.params, &val_shards)?;
            let improved = best.as_ref().map_or(best_tau.is_none_or(|b| e.tau > b), |b| e.tau > b.tau);
            if improved {
                init.with_trained(&state.params)?.save(&out.join("best"), true)?;
                best = Some(e.clone());
                state.extra["best_tau"] = e.tau.into();
            }
            state.extra["sampler_rng"] = rng.state.into();
            state.save(&state_dir, true)?;
            Some(e)
        } else {
            None
        };
        on_progress(&Progress {
            step,
            steps: cfg.steps,
            loss,
            ce: scalar(&values[1])?,
            tv: scalar(&values[2])?,
            bce: scalar(&values[3])?,
            bce_greedy: scalar(&values[4])?,
            lr,
            anchors_per_s,
            eta_s: (cfg.steps - step) as f64 * cfg.batch as f64 / anchors_per_s.max(1e-9),
            eval,
        });
        if cfg.stop_after.is_some_and(|s| step >= s) {
            break;
        }
    }
    let done = state.opt.step - start_step;
    Ok(TrainReport {
        steps: state.opt.step,
        first_loss,
        last_loss,
        initial,
        best,
        best_dir: out.join("best"),
        anchors_per_s: done as f64 * cfg.batch as f64 / t0.elapsed().as_secs_f64().max(1e-9),
    })
}
