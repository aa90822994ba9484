//! `dspark profile`: measures the target's verify cost v(n) = T_verify(n) / T_decode(1) on this
//! device and dtype (stepwise, tapped for the drafter, as the decode loop runs it), and what the
//! drafter's proposal of a block costs, and stores them next to the model, where `generate
//! --schedule` finds them.

use anyhow::{bail, Context, Result};
use engine::args::{ComputeArgs, DrafterArg, TargetArg};
use gemma4::{Model, TapSet};
use spec_decode::profile::{measure, profile_key, store};

/// Arguments of `dspark profile`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArg,
    // The drafter's taps are computed by the timed verify forward, and its γ sets the longest
    // window (γ + 1); `none` times untapped windows.
    #[command(flatten)]
    drafter: DrafterArg,
    /// Longest verify window measured, in tokens (default: the drafter's γ + 1, else 9).
    #[arg(long, allow_negative_numbers = true, value_parser = engine::args::count(2, 64, "tokens"))]
    max_n: Option<usize>,
    /// Tokens in the cache before each timed forward.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true,
          value_parser = engine::args::count(2, usize::MAX, "tokens in the cache"))]
    context: usize,
    /// Timed repetitions per point (the median is stored).
    #[arg(long, default_value_t = 7, allow_negative_numbers = true,
          value_parser = engine::args::count(1, usize::MAX, "timed repetitions"))]
    repeats: usize,
    #[command(flatten)]
    compute: ComputeArgs,
}

pub fn run(a: Args) -> Result<()> {
    let drafter_arg = crate::paths::drafter_choice(a.target.model.as_deref(), a.drafter.drafter.as_deref());
    let dir = crate::paths::select_target(a.target.model.as_deref(), drafter_arg, a.compute.device)?;
    // The cache must hold the context and the longest window: checked on config.json alone,
    // before the weights load.
    let positions = gemma4::TextConfig::from_dir(&dir)
        .with_context(|| format!("reading the model's config in {}", dir.display()))?
        .max_position_embeddings;
    let shortest = a.max_n.unwrap_or(2);
    if a.context + shortest > positions {
        bail!(
            "--context {}: the model holds {positions} positions (max_position_embeddings), and the context \
             plus a window of {shortest} tokens must fit; expected at most {}",
            a.context,
            positions.saturating_sub(shortest)
        );
    }
    let (model, resolved) = Model::load_as(&dir, a.compute.dtype, a.compute.device)
        .with_context(|| format!("loading the model in {}", dir.display()))?;
    let mut drafter = match drafter_arg {
        None => None,
        Some(d) => {
            let ddir = crate::paths::drafter_dir(d)?;
            Some(
                spec_decode::loader::load_drafter_as(&ddir, model.config(), resolved.conversion.dequantize)
                    .with_context(|| format!("loading the drafter in {}", ddir.display()))?,
            )
        }
    };
    let taps = drafter.as_ref().map_or_else(TapSet::default, |d| d.taps());
    let max_n = a.max_n.unwrap_or_else(|| drafter.as_ref().map_or(9, |d| d.gamma() + 1)).max(2);
    let key = profile_key(a.compute.device, &model);
    eprintln!(
        "dspark: profiling {} ({}, {key}) with {} tap point(s), windows 1..={max_n}, {} repeats after {} tokens",
        dir.display(),
        resolved.describe(),
        taps.points().len(),
        a.repeats,
        a.context
    );
    let d: Option<&mut dyn spec_decode::Drafter> = match drafter.as_mut() {
        Some(d) => Some(d.as_mut()),
        None => None,
    };
    let p = measure(&model, d, max_n, a.context, a.repeats)?;
    println!("one decode step: {:.2} ms", p.decode_ms);
    if let (Some(g), Some(s)) = (&p.draft_by_len, &p.draft_by_len_sampled) {
        println!("| k (drafts proposed) | greedy | sampled (T = 1) |");
        println!("|---|---|---|");
        for (k, (g, s)) in g.iter().zip(s).enumerate() {
            println!("| {} | {g:.3} | {s:.3} |", k + 1);
        }
    }
    println!("| n (tokens verified) | v(n) |");
    println!("|---|---|");
    for (n, v) in p.cost.iter().enumerate() {
        println!("| {} | {v:.3} |", n + 1);
    }
    let path = store(&dir, &key, &p).with_context(|| format!("storing the profile next to {}", dir.display()))?;
    println!("written to {} (key {key})", path.display());
    Ok(())
}
