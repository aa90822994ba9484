//! `dspark calibrate`: makes a drafter's confidence mean probability (DSpark, or DeepSpec with
//! its confidence head). Speculative runs on held-out prompts (greedy and sampled: acceptance
//! differs) give, per verify round, the confidence logits of the drafts and how many were
//! accepted. From them:
//! - sequential temperature scaling (STS) and isotonic survival maps per mode, fitted on half
//!   of the prompts and reported on the other half (ECE, AUROC and Brier score of the survival
//!   per block position: raw, scaled, and after the maps), for the throughput schedule;
//! - per-position precision thresholds (greedy rounds), for `--calibrated` pruning;
//! - a reliability diagram (PNG).
//!
//! The run itself is `spec_decode::calibration::calibrate`; this module checks the flags, loads
//! the target and the drafter, chooses the prompts, prints the tables, draws the diagram and
//! writes the files. The result is stored in the checkpoint: `config.sts` (version 3) of a
//! DSpark `dspark.json`, or the `dspark-calibration.json` sidecar of a DeepSpec checkpoint.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::Model;
use spec_decode::calibration::reliability::reliability_bins;
use spec_decode::calibration::rounds_file::rounds_text;
use spec_decode::calibration::sts::{RoundSample, Sts};
use spec_decode::calibration::{
    calibrate, check_drafter, CalibrationError, CalibrationSettings, ModeFit, Progress, RoundSource,
};
use spec_decode::loader::{is_calibrated, load_drafter, write_calibration};

use crate::plot::ReliabilityPanel;

/// The most synthetic prompts one run may ask for.
pub const MAX_PROMPTS: usize = 100_000;
/// Length of each synthetic prompt.
const SYNTHETIC_PROMPT_LEN: u32 = 8;
/// Ids below this are left out of synthetic prompts (pad, eos, bos, unk in Gemma vocabularies).
const FIRST_ORDINARY_ID: u32 = 4;
/// Seed of the default model's calibration prompts (cut from validation-split files).
const PROMPT_SEED: u64 = 0xca1b;

/// Arguments of `dspark calibrate`. Numeric options accept negative values at parse time so the
/// range checks can say what is allowed.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: engine::args::TargetArg,
    /// Drafter checkpoint to calibrate, DSpark or DeepSpec with a confidence head (`default`:
    /// the embedded default drafter, which needs --out).
    #[arg(long)]
    drafter: String,
    /// Write the calibrated drafter here (a copy) instead of into --drafter.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prompts, one a line: plain text or JSON `{"prompt": "..."}` (through the target's
    /// tokenizer; the first --prompts are used). Without it: the heads of, then windows inside,
    /// validation-split standard-library files for the default model, synthetic token prompts
    /// for others.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Number of prompts (2 to 100000; `cargo xtask train-default` calibrates the default on 3000).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true,
          value_parser = engine::args::count(2, MAX_PROMPTS, "prompts (half fit, half held out)"))]
    prompts: usize,
    /// Tokens generated per prompt (at least 1).
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    tokens: usize,
    /// Sampling temperatures to calibrate for, comma-separated: 0 is greedy; one positive
    /// temperature gives the sampled fit.
    #[arg(long, default_value = "0,1", value_delimiter = ',', allow_negative_numbers = true)]
    temperatures: Vec<f64>,
    /// Precision of the pruning thresholds: P(accepted | confidence ≥ threshold), in (0, 1].
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    target: f32,
    /// Positions with fewer samples are never pruned and keep T = 1 and no survival map.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true)]
    min_samples: usize,
    /// Positions fitted on fewer rounds get no isotonic survival map, only the temperature and
    /// shift (a map fitted on a few hundred prompts learns their noise).
    #[arg(long, default_value_t = 10_000, allow_negative_numbers = true)]
    min_map_rounds: usize,
    /// The reliability diagram (default: reliability.png in the calibrated drafter's directory).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Also write every verify round here, one JSON object a line (`temperature`, `prompt`,
    /// `logits`, `accepted`), to study or refit the calibration without rerunning the decodes.
    #[arg(long)]
    rounds_out: Option<PathBuf>,
    /// Fit from the rounds a `--rounds-out` file holds instead of running the decodes (the
    /// prompts' halves and the temperatures are read from it; --prompts and --tokens are unused).
    #[arg(long, conflicts_with = "rounds_out")]
    rounds_in: Option<PathBuf>,
    /// Replace an existing calibration.
    #[arg(long)]
    force: bool,
}

/// The run's settings as the flags give them (the stop tokens come with the target).
fn settings(a: &Args) -> CalibrationSettings {
    CalibrationSettings {
        temperatures: a.temperatures.clone(),
        tokens: a.tokens,
        stop_tokens: Vec::new(),
        target: a.target,
        min_samples: a.min_samples,
        min_map_rounds: a.min_map_rounds,
        keep_rounds: a.rounds_out.is_some(),
    }
}

/// Checks the flags on their own, before anything is loaded or written.
fn check_flags(a: &Args) -> Result<()> {
    // The settings are named as their flags.
    settings(a).check().map_err(|e| anyhow::anyhow!("--{e}"))?;
    // Every output is checked before hours of speculative runs, not only after them.
    if let Some(out) = &a.out {
        refuse_nonempty_out(out)?;
        crate::paths::check_creatable_dir(out, "--out")?;
    } else if a.drafter != "default" {
        // Calibrated in place: the drafter's own directory takes the new dspark.json.
        let dir = Path::new(&a.drafter);
        if dir.is_dir() {
            crate::paths::check_writable_dir(dir).map_err(|e| {
                anyhow::anyhow!("--drafter {}: calibrating in place, but {e}; pass --out DIR", dir.display())
            })?;
        }
    }
    if let Some(path) = &a.rounds_out {
        crate::paths::check_output_file(path, "--rounds-out")?;
    }
    if let Some(path) = &a.plot {
        crate::paths::check_output_file(path, "--plot")?;
    }
    if a.drafter == "default" {
        if let Some(m) = &a.model.model {
            bail!(
                "--drafter default is the embedded default model's drafter and is only calibrated against that model, \
                 not --model {}; pass your own drafter directory",
                m.display()
            );
        }
        if a.out.is_none() {
            bail!(
                "--drafter default: the embedded drafter is not changed in place (it ships calibrated); \
                 pass --out DIR for a recalibrated copy"
            );
        }
    }
    Ok(())
}

/// `count` synthetic prompts of `len` tokens spread over the ordinary ids of a vocabulary of
/// `vocab` tokens (ids from 4 up; the first four are special in Gemma vocabularies).
pub fn synthetic_prompts(vocab: usize, count: usize, len: u32) -> Result<Vec<Vec<u32>>> {
    let v = u32::try_from(vocab).ok().filter(|&v| v > FIRST_ORDINARY_ID).with_context(|| {
        format!(
            "the vocabulary has {vocab} tokens; synthetic prompts need more than {FIRST_ORDINARY_ID} (and at most \
             {}) — pass prompts as text with --prompt-file",
            u32::MAX
        )
    })?;
    let count = u32::try_from(count).with_context(|| format!("{count} synthetic prompts is too many"))?;
    let span = u64::from(v - FIRST_ORDINARY_ID);
    let id = |i: u32, j: u32| {
        let k = (u64::from(i) * 131 + u64::from(j) * 29 + 7) % span;
        // k < span ≤ u32::MAX - 4, so the sum fits.
        FIRST_ORDINARY_ID + k as u32
    };
    Ok((0..count).map(|i| (0..len).map(|j| id(i, j)).collect()).collect())
}

/// Positions left without a survival map, and what would give them one.
fn warn_unmapped(m: &ModeFit, a: &Args) {
    if !m.unmapped.is_empty() {
        eprintln!(
            "calibrate ({}): positions {:?} have fewer than {} fitted rounds (--min-map-rounds, --min-samples), so \
             they get no survival map; calibrate on more prompts for one",
            m.label,
            m.unmapped.iter().map(|k| k + 1).collect::<Vec<_>>(),
            a.min_map_rounds.max(a.min_samples)
        );
    }
}

fn print_table(m: &ModeFit) {
    println!("\n{} — {} rounds fitted, {} held out", m.label, m.fit.rounds, m.held_out.len());
    println!(
        "| position | T | b | rounds | ECE raw | ECE scaled | ECE after | AUROC before | AUROC after | Brier before \
         | Brier after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let au = |x: Option<f64>| x.map_or_else(|| "—".to_string(), |v| format!("{v:.3}"));
    for (k, ((b, s), a)) in m.before.iter().zip(&m.scaled).zip(&m.after).enumerate() {
        println!(
            "| {} | {:.2} | {:.2} | {} | {:.2}% | {:.2}% | {:.2}% | {} | {} | {:.4} | {:.4} |",
            k + 1,
            m.fit.temperatures[k],
            m.fit.shifts.get(k).copied().unwrap_or(0.0),
            b.rounds,
            100.0 * b.ece,
            100.0 * s.ece,
            100.0 * a.ece,
            au(b.auroc),
            au(a.auroc),
            b.brier,
            a.brier
        );
    }
}

fn panel(title: String, sts: &Sts, rounds: &[RoundSample], gamma: usize) -> ReliabilityPanel {
    let positions = (0..gamma)
        .map(|k| {
            let (p, y) = sts.position_outcomes(rounds, k);
            // Bins of fewer than 10 rounds are noise.
            reliability_bins(&p, &y, 10).into_iter().filter(|b| b.2 >= 10).map(|b| (b.0, b.1)).collect()
        })
        .collect();
    ReliabilityPanel { title, positions }
}

fn load_prompts(
    a: &Args,
    model: &Model,
    model_dir: &Path,
    default_model: bool,
) -> Result<(Vec<Vec<u32>>, Option<Tokenizer>)> {
    // Text prompts need the tokenizer; otherwise it is read (if the checkpoint has one) only for
    // the end-of-sequence fallback when the config names no eos ids.
    let needs_tokenizer = a.prompt_file.is_some()
        || default_model
        || (model.config().eos_token_ids.is_empty() && model_dir.join("tokenizer.json").is_file());
    let tok = if needs_tokenizer { Some(Tokenizer::from_dir(model_dir)?) } else { None };
    let prompts: Vec<Vec<u32>> = match (&a.prompt_file, &tok) {
        (Some(f), Some(tok)) => train::regen::read_inputs(f, "prompt")
            .with_context(|| format!("--prompt-file {}", f.display()))?
            .iter()
            .take(a.prompts)
            .map(|l| tok.encode(l, true))
            .collect::<Result<_, _>>()
            .with_context(|| format!("--prompt-file {}", f.display()))?,
        (None, Some(tok)) if default_model => {
            let heads = train::prompts::stdlib_prompts(train::corpus::Split::Validation, a.prompts, PROMPT_SEED)
                .context("cutting calibration prompts (pass --prompt-file, or fewer --prompts)")?;
            heads.iter().map(|p| tok.encode(&p.text, true)).collect::<Result<_, _>>()?
        }
        _ => synthetic_prompts(model.config().vocab_size, a.prompts, SYNTHETIC_PROMPT_LEN)?,
    };
    if prompts.len() < 2 {
        let e = CalibrationError::TooFewPrompts { prompts: prompts.len() };
        bail!("{e}; the prompt file has too few non-blank lines");
    }
    Ok((prompts, tok))
}

/// `--out` must be absent or an empty directory.
fn refuse_nonempty_out(out: &Path) -> Result<()> {
    if out.exists() && std::fs::read_dir(out).map_or(true, |mut d| d.next().is_some()) {
        bail!("--out {}: exists and is not an empty directory", out.display());
    }
    Ok(())
}

/// Copies a drafter checkpoint's files into `out` (created; an existing non-empty `out` is
/// refused, here and before the runs by `check_flags`).
fn copy_drafter(from: &Path, out: &Path) -> Result<()> {
    refuse_nonempty_out(out)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        if e.path().is_file() {
            std::fs::copy(e.path(), out.join(e.file_name()))
                .with_context(|| format!("copying {} to {}", e.path().display(), out.display()))?;
        }
    }
    Ok(())
}

/// Runs the subcommand: flags are checked first, then the speculative runs, then the
/// calibration is written into the drafter checkpoint.
pub fn run(a: Args) -> Result<()> {
    check_flags(&a)?;
    if let Some(m) = &a.model.model {
        crate::paths::refuse_drafter_as_model(m, "--model")?;
    }
    let default_model = a.model.model.is_none();
    let model_dir = match &a.model.model {
        Some(d) => d.clone(),
        None => crate::default_model::ensure(false)?,
    };
    let model = Model::load_as(&model_dir, gemma4::ComputeDtype::Auto, mlx_core::Device::Cpu)
        .map(|m| m.0)
        .with_context(|| format!("loading {}", model_dir.display()))?;
    let (prompts, tok) = match a.rounds_in {
        Some(_) => (Vec::new(), None),
        None => load_prompts(&a, &model, &model_dir, default_model)?,
    };
    let src = crate::paths::drafter_dir(&a.drafter)?;
    let mut drafter =
        load_drafter(&src, model.config()).with_context(|| format!("loading the drafter in {}", src.display()))?;
    check_drafter(drafter.as_ref()).map_err(|e| anyhow::anyhow!("{}: {e}", src.display()))?;
    if is_calibrated(&src)? && !a.force && a.out.is_none() {
        bail!("{} is already calibrated — pass --force to recalibrate", src.display());
    }
    let gamma = drafter.gamma();
    let settings = CalibrationSettings { stop_tokens: stop_tokens(model.config(), tok.as_ref()), ..settings(&a) };
    let source = match &a.rounds_in {
        Some(path) => RoundSource::File(path),
        None => RoundSource::Decode(&prompts),
    };
    let run = calibrate(&model, drafter.as_mut(), source, &settings, |p| match p {
        Progress::Decoded { mode, prompt, prompts, rounds } => {
            eprintln!("calibrate ({mode}): prompt {prompt}/{prompts}, {rounds} rounds")
        }
        Progress::Fitted(m) => {
            warn_unmapped(m, &a);
            print_table(m);
        }
        _ => {}
    })
    .map_err(|e| match &a.rounds_in {
        // Errors reading the rounds file name the file; say which flag gave it.
        Some(path) => anyhow::Error::new(e).context(format!("--rounds-in {}", path.display())),
        None => e.into(),
    })?;
    // The files next to the result are written first and the drafter last, so a failure on
    // any of them leaves the drafter as it was and the run can simply be repeated.
    if let Some(path) = &a.rounds_out {
        mlx_core::files::write_atomic(path, rounds_text(&run.rounds)?.as_bytes())
            .with_context(|| format!("writing --rounds-out {}", path.display()))?;
        println!("rounds written to {}", path.display());
    }
    let mut panels = Vec::new();
    for m in &run.modes {
        panels.push(panel(format!("{}: raw confidence", m.label), &Sts::identity(gamma), &m.held_out, gamma));
        panels.push(panel(format!("{}: after STS and the isotonic maps", m.label), &m.sts, &m.held_out, gamma));
    }
    let title = format!("{}: survival vs all-accepted, held-out rounds", drafter.name());
    if let Some(png) = &a.plot {
        if crate::plot::reliability(png, &title, &panels, 2)? {
            println!("reliability diagram: {}", png.display());
        }
    }
    let dest = match &a.out {
        Some(out) => {
            copy_drafter(&src, out)?;
            out.clone()
        }
        None => src.clone(),
    };
    let cal = &run.calibration;
    write_calibration(&dest, cal)?;
    println!("\npruning thresholds by block position (precision {}): {:?}", a.target, cal.thresholds);
    println!("calibration written to {}", dest.display());
    if a.plot.is_none() {
        // The default diagram lives in the calibrated drafter's directory.
        let png = dest.join("reliability.png");
        if crate::plot::reliability(&png, &title, &panels, 2)? {
            println!("reliability diagram: {}", png.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_prompts_need_a_vocabulary_above_the_special_ids() {
        // A vocabulary of 4 divided by zero, below 4 the subtraction wrapped.
        for vocab in [0, 3, 4] {
            let e = synthetic_prompts(vocab, 2, 8).unwrap_err().to_string();
            assert!(e.contains(&format!("has {vocab} tokens")), "{e}");
        }
        let p = synthetic_prompts(5, 3, 8).unwrap();
        assert_eq!(p, vec![vec![4; 8]; 3]);
        let p = synthetic_prompts(262_144, MAX_PROMPTS, 8).unwrap();
        assert_eq!(p.len(), MAX_PROMPTS);
        assert!(p.iter().flatten().all(|&t| (4..262_144).contains(&t)));
    }

    #[test]
    fn synthetic_prompts_do_not_wrap_a_huge_count() {
        let e = synthetic_prompts(100, 1 << 32, 8).unwrap_err().to_string();
        assert!(e.contains("too many"), "{e}");
    }
}
