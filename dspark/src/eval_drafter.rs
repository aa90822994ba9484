//! `dspark eval-drafter`: live τ (greedy and sampled speculative decoding) next to analytic τ
//! (the training metric) on the same held-out prompts, with per-position acceptance.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::Model;
use spec_decode::dspark::DSparkDrafter;
use train::live::{eval_live, LiveOptions};
use train::regen::{read_inputs, Encoder};

/// Arguments of `dspark eval-drafter`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: engine::args::ModelDirArg,
    /// DSpark drafter checkpoint (e.g. `dspark train`'s OUT/best).
    #[arg(long)]
    drafter: PathBuf,
    /// Held-out prompts: JSONL `{"prompt": …}` or one per line.
    #[arg(long)]
    prompts: PathBuf,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    max_new: usize,
    /// Seed of the sampled runs (prompt i uses seed + i).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Context rows of the analytic forward (as in training).
    #[arg(long, default_value_t = 256, allow_negative_numbers = true)]
    max_ctx: usize,
}

fn fmt_acc(v: impl Iterator<Item = f64>) -> String {
    v.map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" ")
}

pub fn run(a: Args) -> Result<()> {
    if a.max_new < 2 || a.max_ctx == 0 {
        bail!("--max-new must be at least 2 and --max-ctx at least 1");
    }
    crate::paths::refuse_drafter_as_model(&a.model.model, "--model")?;
    let texts = read_inputs(&a.prompts, "prompt")?;
    if texts.is_empty() {
        bail!("{}: no prompts in this file", a.prompts.display());
    }
    let model = Model::load_as(&a.model.model, gemma4::ComputeDtype::Auto, mlx_core::Device::Cpu)
        .map(|m| m.0)
        .with_context(|| format!("loading the target {}", a.model.model.display()))?;
    let mut drafter = DSparkDrafter::load(&a.drafter, model.config())
        .with_context(|| format!("loading the drafter {}", a.drafter.display()))?;
    let tok =
        if a.model.model.join("tokenizer.json").is_file() { Some(Tokenizer::from_dir(&a.model.model)?) } else { None };
    let enc = Encoder::new(tok.as_ref(), model.config().vocab_size, true)?;
    let prompts = texts
        .iter()
        .enumerate()
        .map(|(i, t)| enc.encode(&format!("{}:{}", a.prompts.display(), i + 1), t))
        .collect::<train::Result<Vec<_>>>()?;
    let opts = LiveOptions {
        max_new: a.max_new,
        stop_tokens: stop_tokens(model.config(), tok.as_ref()),
        seed: a.seed,
        max_ctx: a.max_ctx,
    };
    eprintln!("evaluating on {} prompt(s), {} new tokens each", prompts.len(), a.max_new);
    let r = eval_live(&model, &mut drafter, &prompts, &opts)?;
    let pos = |s: &spec_decode::SpecStats| {
        fmt_acc(s.accepted_by_pos.iter().zip(&s.drafted_by_pos).map(|(&x, &d)| x as f64 / d.max(1) as f64))
    };
    println!(
        "| measure | τ | by position (live: share of rounds accepting it; analytic: mean a_k given the earlier ones) |"
    );
    println!("|---|---|---|");
    println!("| live greedy | {:.3} | {} |", r.greedy.tau(), pos(&r.greedy));
    println!("| live sampled (T = 1) | {:.3} | {} |", r.sampled.tau(), pos(&r.sampled));
    println!("| analytic (T = 1) | {:.3} | {} |", r.analytic.tau, fmt_acc(r.analytic.acceptance.iter().copied()));
    println!(
        "live greedy τ is {:+.1}% of analytic; live sampled {:+.1}%",
        100.0 * (r.greedy.tau() / r.analytic.tau - 1.0),
        100.0 * (r.sampled.tau() / r.analytic.tau - 1.0)
    );
    Ok(())
}
