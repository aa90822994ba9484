//! `dspark train`: trains a DSpark drafter for a target on shards written by `dspark regen`.
//! The drafter's tap layers come from the data (so regen and training always agree); the run
//! keeps the checkpoint with the best validation τ in `<out>/best` and a resumable state in
//! `<out>/state`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gemma4::Model;
use indicatif::{ProgressBar, ProgressStyle};
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::Drafter;
use train::drafter_train::{train_drafter, DrafterTrainConfig};
use train::shards::list_shards;

/// Arguments of `dspark train`.
#[derive(clap::Args)]
pub struct Args {
    // The frozen target the data was regenerated from.
    #[command(flatten)]
    model: engine::args::ModelDirArg,
    /// Directories of shards written by `dspark regen`, comma-separated or the flag repeated
    /// (say greedy and sampled continuations): each is split into train / validation / test
    /// on its own and the slices are pooled.
    #[arg(long, required = true, value_delimiter = ',')]
    data: Vec<PathBuf>,
    /// Output directory (`best/` = the drafter checkpoint, `state/` = the resumable state).
    #[arg(long)]
    out: PathBuf,
    /// Drafts per block (γ).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "drafts per block"))]
    gamma: usize,
    /// Backbone layers.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "layers"))]
    layers: usize,
    /// Backbone width.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "features"))]
    d_model: usize,
    /// Attention heads (must divide --d-model).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "heads"))]
    heads: usize,
    /// Rank of the Markov head.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "as the Markov head's rank"))]
    markov_rank: usize,
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true)]
    steps: u64,
    /// Anchors per step.
    #[arg(long, default_value_t = 16, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "anchors per step"))]
    batch: usize,
    /// Peak learning rate (AdamW, warmup then cosine to 10%).
    #[arg(long, default_value_t = 3e-3, allow_negative_numbers = true, value_parser = engine::args::positive)]
    lr: f64,
    #[arg(long, default_value_t = 50, allow_negative_numbers = true)]
    warmup: u64,
    /// Context rows before each anchor; also the trained drafter's context window at run time.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "context rows"))]
    max_ctx: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Evaluate (analytic τ on the validation shards) every N steps.
    #[arg(long, default_value_t = 100, allow_negative_numbers = true)]
    eval_every: u64,
    /// Continue the run in --out from its saved state.
    #[arg(long, conflicts_with = "force")]
    resume: bool,
    /// Start over in an existing --out.
    #[arg(long)]
    force: bool,
    /// Train only the paper's confidence head ([h_k; W1[x_{k−1}]], sampled acceptance). By
    /// default the heads also read the draft law's top-1 log-probability and entropy, and a
    /// second head learns greedy acceptance for greedy decoding.
    #[arg(long)]
    paper_confidence: bool,
}

fn check_flags(a: &Args) -> Result<()> {
    if a.steps == 0 || a.eval_every == 0 {
        bail!("--steps and --eval-every must be at least 1");
    }
    if !a.d_model.is_multiple_of(a.heads) {
        bail!("--heads {} does not divide --d-model {}", a.heads, a.d_model);
    }
    Ok(())
}

/// Peak resident memory of this process (VmHWM), if the OS reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kb / 1024.0)
}

pub fn run(a: Args) -> Result<()> {
    check_flags(&a)?;
    crate::paths::refuse_drafter_as_model(&a.model.model, "--model")?;
    let has_run = a.out.join("state").exists() || a.out.join("best").exists();
    if has_run && !a.resume && !a.force {
        bail!(
            "{} already holds a training run: pass --resume to continue it or --force to start over",
            a.out.display()
        );
    }
    if a.resume && !a.out.join("state").exists() {
        bail!("--resume: {} has no saved state to continue", a.out.display());
    }
    let model = Model::load_as(&a.model.model, gemma4::ComputeDtype::Auto, mlx_core::Device::Cpu)
        .map(|m| m.0)
        .with_context(|| format!("loading the target {}", a.model.model.display()))?;
    let mut shards = Vec::new();
    for dir in &a.data {
        let found = list_shards(dir, None).with_context(|| format!("reading the shards in {}", dir.display()))?;
        if found.is_empty() {
            bail!("--data {}: holds no shard_* directories (write them with `dspark regen`)", dir.display());
        }
        shards.extend(found);
    }
    // The taps come from the data; train_drafter checks every directory against them.
    let meta = train::shards::read_meta(&shards[0])?;
    let cfg = DSparkConfig {
        gamma: a.gamma,
        d_draft: a.d_model,
        n_layers: a.layers,
        n_heads: a.heads,
        markov_rank: a.markov_rank,
        ff_mult: 2,
        tap_layers: meta.tap_layers.clone(),
        seq_head: None,
        sts: None,
        // At run time the backbone reads as many context rows as it trained with.
        ctx_window: Some(a.max_ctx),
        conf_law: !a.paper_confidence,
        greedy_head: !a.paper_confidence,
    };
    let name = a.model.model.file_name().and_then(|n| n.to_str()).unwrap_or("target");
    let init = DSparkDrafter::init(cfg, model.config(), name, a.seed, false)?;
    let tc = DrafterTrainConfig {
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        warmup: a.warmup.min(a.steps),
        max_ctx: a.max_ctx,
        seed: a.seed,
        eval_every: a.eval_every,
        ..Default::default()
    };
    eprintln!(
        "training {} on {} shard(s) of {} (taps {:?}), γ {}, {} steps of {} anchors",
        init.name(),
        shards.len(),
        a.data.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", "),
        meta.tap_layers,
        a.gamma,
        a.steps,
        a.batch
    );
    let bar = ProgressBar::new(a.steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed} < {eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = train_drafter(&model, &init, &a.data, &a.out, &tc, a.resume, |p| {
        bar.set_position(p.step);
        bar.set_message(format!(
            "loss {:.3} (ce {:.3} tv {:.3} bce {:.3} greedy bce {:.3}) lr {:.2e} {:.0} anchors/s",
            p.loss, p.ce, p.tv, p.bce, p.bce_greedy, p.lr, p.anchors_per_s
        ));
        if let Some(e) = &p.eval {
            let acc: Vec<String> = e.acceptance.iter().map(|x| format!("{x:.2}")).collect();
            let line = format!(
                "step {}: validation τ {:.3} (greedy {:.3}), acceptance by position [{}]",
                p.step,
                e.tau,
                e.greedy_tau,
                acc.join(" ")
            );
            // A hidden bar (no terminal) drops println: the evaluations still belong in the log.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    })?;
    bar.finish_and_clear();
    let best = report.best.as_ref().map_or_else(|| "none".to_string(), |b| format!("{:.3}", b.tau));
    println!(
        "{} steps: loss {:.3} -> {:.3}; validation τ {:.3} at the start, best {best} (saved in {}); {:.0} anchors/s; peak RSS {}",
        report.steps,
        report.first_loss,
        report.last_loss,
        report.initial.tau,
        report.best_dir.display(),
        report.anchors_per_s,
        peak_rss_mib().map_or_else(|| "unknown".into(), |m| format!("{m:.0} MiB"))
    );
    Ok(())
}
