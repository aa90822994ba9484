//! `dspark regen`: drafter training data from the target itself — the target answers each
//! prompt (or is teacher-forced on documents with `--from-text`) and its tapped hidden rows are
//! written as shards. The work is done by `train::regen::regen`; this is flag checking, the
//! progress bar and the summary line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gemma4::tokenizer::Tokenizer;
use gemma4::Model;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use train::regen::{default_taps, read_input_lines, regen, validate_taps, RegenMode, RegenOptions};

/// Arguments of `dspark regen`. Numeric options accept negative values at parse time so the
/// range checks can say what is allowed.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompts", "from_text"])))]
pub struct Args {
    // Without a tokenizer.json, inputs are token ids separated by commas or spaces.
    #[command(flatten)]
    model: engine::args::ModelDirArg,
    /// Prompts: one a line, plain text or JSON `{"prompt": "..."}`. The tokenizer's chat
    /// template (if any) is applied.
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Teacher-force these documents instead of generating: one a line, plain text or JSON
    /// `{"text": "..."}`, cut into pieces of at most --max-len tokens.
    #[arg(long)]
    from_text: Option<PathBuf>,
    /// Output directory for the shards and regen.ledger; a rerun resumes where it stopped.
    #[arg(long)]
    out: PathBuf,
    /// Maximum tokens generated per prompt.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true, conflicts_with = "from_text")]
    max_new: i64,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true, conflicts_with = "from_text",
          value_parser = engine::args::temperature)]
    temperature: f64,
    /// Sampling seed; prompt i is sampled with seed + i.
    #[arg(long, default_value_t = 0, conflicts_with = "from_text")]
    seed: u64,
    /// Longest piece of a --from-text document, in tokens (default 512).
    #[arg(long, allow_negative_numbers = true)]
    max_len: Option<i64>,
    /// Tapped layers, comma-separated, the last being the number of layers (the final-norm
    /// output); index i below it is the residual after layer i. Default: L/4, L/2, 3L/4, L.
    #[arg(long)]
    taps: Option<String>,
    /// Sequences per shard.
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    seqs_per_shard: i64,
    /// Start over: remove the shards and ledger in --out (other files there are left alone),
    /// and accept an --out that is not a regen directory.
    #[arg(long)]
    force: bool,
    /// Encode prompts as plain text even if the tokenizer has a chat template (for a base
    /// model continuing text, such as the embedded default continuing code).
    #[arg(long, conflicts_with = "from_text")]
    plain: bool,
    // The stored rows are bf16 whatever the compute dtype.
    #[command(flatten)]
    compute: engine::args::ComputeArgs,
}

fn parse_taps(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .map(str::trim)
        .map(|t| t.parse::<usize>().with_context(|| format!("--taps {s:?}: {t:?} is not a layer index")))
        .collect()
}

fn at_least(flag: &str, v: i64, min: i64) -> Result<usize> {
    if v < min {
        bail!("{flag} {v}: must be at least {min}");
    }
    Ok(v as usize)
}

/// Runs the subcommand: flags and the input file are checked first, then the target loads and
/// the shards are written with a progress bar on stderr and a summary line on stdout.
pub fn run(a: Args) -> Result<()> {
    let seqs_per_shard = at_least("--seqs-per-shard", a.seqs_per_shard, 1)?;
    let taps = a.taps.as_deref().map(parse_taps).transpose()?;
    let (mode, input, key) = match (&a.prompts, &a.from_text) {
        (Some(p), None) => {
            let max_new = at_least("--max-new", a.max_new, 1)?;
            if a.max_len.is_some() {
                bail!("--max-len applies to --from-text documents only; prompts are limited by --max-new");
            }
            (RegenMode::Generate { max_new, temperature: a.temperature, seed: a.seed }, p, "prompt")
        }
        (None, Some(t)) => {
            (RegenMode::FromText { max_len: at_least("--max-len", a.max_len.unwrap_or(512), 2)? }, t, "text")
        }
        _ => bail!("give exactly one of --prompts and --from-text"),
    };
    if !a.compute.device.is_available() {
        bail!("--device {:?}: this MLX build has no such backend (MLX at {})", a.compute.device, mlx_core::MLX_DIR);
    }
    crate::paths::refuse_drafter_as_model(&a.model.model, "--model")?;
    crate::paths::check_out_dir(&a.model.model, &a.out)?;
    let (labels, inputs): (Vec<String>, Vec<String>) = read_input_lines(input, key)?.into_iter().unzip();
    if inputs.is_empty() {
        bail!("{}: no {key}s in this file", input.display());
    }

    a.compute.device.set_default()?;
    eprintln!("dspark: loading {}", a.model.model.display());
    let (model, resolved) = Model::load_as(&a.model.model, a.compute.dtype, a.compute.device)
        .with_context(|| format!("loading the model in {}", a.model.model.display()))?;
    eprintln!("dspark: computing in {}", resolved.describe());
    let layers = model.config().num_hidden_layers;
    let taps = taps.unwrap_or_else(|| default_taps(layers));
    validate_taps(&taps, layers).context("--taps")?;
    let tokenizer =
        if a.model.model.join("tokenizer.json").is_file() { Some(Tokenizer::from_dir(&a.model.model)?) } else { None };
    if tokenizer.is_none() {
        eprintln!("dspark: {} has no tokenizer.json; reading inputs as token ids", a.model.model.display());
    }

    let bar = ProgressBar::with_draw_target(Some(inputs.len() as u64), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {prefix} [{elapsed_precise} < {eta_precise}] {msg}")
            .context("progress bar template")?,
    );
    bar.set_prefix(if key == "prompt" { "prompts" } else { "documents" });
    bar.enable_steady_tick(Duration::from_millis(500));
    let opts =
        RegenOptions { mode, taps: taps.clone(), seqs_per_shard, force: a.force, labels, plain_prompts: a.plain };
    let result = regen(&model, tokenizer.as_ref(), &inputs, &a.out, &opts, |p| {
        bar.set_position(p.done as u64);
        if p.skipped > 0 && p.done == p.skipped {
            // Skipped items took no time: the estimate starts from here.
            bar.reset_eta();
        }
        let rate = p.tokens as f64 / p.elapsed.as_secs_f64().max(1e-9);
        bar.set_message(format!("{rate:.1} tok/s, {} shards", p.shards));
    });
    bar.finish_and_clear();
    // The library says when starting over must be forced; on the command line that is --force.
    let s = result.map_err(|e| match e {
        train::Error::NeedsForce { .. } => {
            anyhow::Error::new(e).context(format!("regen into {} (--force starts over)", a.out.display()))
        }
        e => e.into(),
    })?;
    let removed = if s.orphans_removed > 0 {
        format!(", {} unrecorded shards of an interrupted run removed and redone", s.orphans_removed)
    } else {
        String::new()
    };
    println!(
        "regen: {} sequences, {} tokens, {} shards written to {} (taps {taps:?}), {} inputs already done{removed}, {:.1} s",
        s.sequences,
        s.tokens,
        s.shards,
        a.out.display(),
        s.skipped,
        s.elapsed.as_secs_f64()
    );
    Ok(())
}
