//! `dspark calibrate`: fits per-position confidence thresholds for a DSpark drafter from greedy
//! speculative runs on the target and stores them in the checkpoint (`config.sts`), so
//! `generate --calibrated` can prune with them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gemma4::generate::GenerateConfig;
use gemma4::tokenizer::{stop_tokens, Tokenizer};
use gemma4::Model;
use spec_decode::calibration::fit_thresholds;
use spec_decode::dspark::{write_calibration, Calibration, DSparkDrafter};
use spec_decode::{speculative_generate, Drafter, Pruning, SpecConfig};

/// The most synthetic prompts one run may ask for.
pub const MAX_PROMPTS: usize = 100_000;
/// Length of each synthetic prompt.
const SYNTHETIC_PROMPT_LEN: u32 = 8;
/// Ids below this are left out of synthetic prompts (pad, eos, bos, unk in Gemma vocabularies).
const FIRST_ORDINARY_ID: u32 = 4;

/// Arguments of `dspark calibrate`. Numeric options accept negative values at parse time so the
/// range checks can say what is allowed.
#[derive(clap::Args)]
pub struct Args {
    /// Target checkpoint (default: the embedded default model).
    #[arg(long)]
    model: Option<PathBuf>,
    /// DSpark drafter checkpoint to calibrate (`default`: the embedded default drafter).
    #[arg(long)]
    drafter: String,
    /// One prompt per line (text, through the target's tokenizer). Without it, synthetic
    /// token prompts are used.
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// Number of synthetic prompts (1 to 100000).
    #[arg(long, default_value_t = 32, allow_negative_numbers = true)]
    prompts: usize,
    /// Tokens generated per prompt (at least 1).
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    tokens: usize,
    /// Target precision: P(accepted | confidence ≥ threshold), in (0, 1].
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    target: f32,
    /// Positions with fewer samples are never pruned.
    #[arg(long, default_value_t = 50, allow_negative_numbers = true)]
    min_samples: usize,
    /// Replace an existing calibration.
    #[arg(long)]
    force: bool,
}

/// Checks the flags on their own, before anything is loaded or written.
fn check_flags(a: &Args) -> Result<()> {
    if !(a.target.is_finite() && a.target > 0.0 && a.target <= 1.0) {
        bail!("--target {}: expected a precision in (0, 1]", a.target);
    }
    if a.tokens == 0 {
        bail!("--tokens 0: expected at least 1 token per prompt");
    }
    if a.prompt_file.is_none() && !(1..=MAX_PROMPTS).contains(&a.prompts) {
        bail!("--prompts {}: expected 1 to {MAX_PROMPTS} synthetic prompts", a.prompts);
    }
    if a.drafter == "default" {
        if let Some(m) = &a.model {
            bail!(
                "--drafter default is the embedded default model's drafter and is only calibrated against that model,                  not --model {}; copy it (the path `dspark init-default` prints) and pass the copy as --drafter, or                  pass your own drafter directory",
                m.display()
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

/// Runs the subcommand: flags are checked first, then the speculative runs, then the
/// thresholds are written into the drafter checkpoint.
pub fn run(a: Args) -> Result<()> {
    check_flags(&a)?;
    if let Some(m) = &a.model {
        crate::paths::refuse_drafter_as_model(m, "--model")?;
    }
    let model_dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::default_model::ensure(false)?,
    };
    let model = Model::load_as(&model_dir, gemma4::ComputeDtype::Auto, mlx_core::Device::Cpu)
        .map(|m| m.0)
        .with_context(|| format!("loading {}", model_dir.display()))?;
    // Text prompts need the tokenizer; otherwise it is read (if the checkpoint has one) only for
    // the end-of-sequence fallback when the config names no eos ids.
    let needs_tokenizer = a.prompt_file.is_some()
        || (model.config().eos_token_ids.is_empty() && model_dir.join("tokenizer.json").is_file());
    let tok = if needs_tokenizer { Some(Tokenizer::from_dir(&model_dir)?) } else { None };
    let prompts: Vec<Vec<u32>> = match (&a.prompt_file, &tok) {
        (Some(f), Some(tok)) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| tok.encode(l, true))
                .collect::<Result<_, _>>()
                .with_context(|| format!("--prompt-file {}", f.display()))?
        }
        _ => synthetic_prompts(model.config().vocab_size, a.prompts, SYNTHETIC_PROMPT_LEN)?,
    };
    let ddir =
        if a.drafter == "default" { crate::default_model::ensure_drafter(false)? } else { PathBuf::from(&a.drafter) };
    let mut drafter = DSparkDrafter::load(&ddir, model.config())
        .with_context(|| format!("loading the DSpark drafter in {}", ddir.display()))?;
    if drafter.config().sts.is_some() && !a.force {
        bail!("{} already has calibrated thresholds — pass --force to recalibrate", ddir.display());
    }
    if prompts.is_empty() {
        bail!("no prompts: the prompt file has no non-blank lines");
    }
    let gamma = drafter.gamma();
    let cfg = SpecConfig {
        generate: GenerateConfig {
            max_tokens: a.tokens,
            stop_tokens: stop_tokens(model.config(), tok.as_ref()),
            ..Default::default()
        },
        gamma: Some(gamma),
        // Active with no threshold: confidences are read, nothing is pruned.
        pruning: Pruning::Thresholds(vec![]),
    };
    let mut samples = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let out = speculative_generate(&model, &mut drafter, p, &cfg, |_| {})?;
        samples.extend(out.conf_samples);
        eprintln!("calibrate: prompt {}/{}: {} samples so far", i + 1, prompts.len(), samples.len());
    }
    let thresholds = fit_thresholds(&samples, gamma, a.target, a.min_samples);
    let cal = Calibration { thresholds: thresholds.clone(), target: a.target, samples: samples.len() };
    write_calibration(&ddir, &cal, a.force)?;
    println!("thresholds by block position: {thresholds:?} ({} samples, target {})", samples.len(), a.target);
    println!("written to {}", ddir.join("dspark.json").display());
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
