//! `dspark calibrate`: fits per-position confidence thresholds for a DSpark drafter from greedy
//! speculative runs on the target and stores them in the checkpoint (`config.sts`), so
//! `generate --calibrated` can prune with them.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use gemma4::generate::GenerateConfig;
use gemma4::Model;
use spec_decode::calibration::fit_thresholds;
use spec_decode::dspark::{write_calibration, Calibration, DSparkDrafter};
use spec_decode::{speculative_generate, Drafter, Pruning, SpecConfig};
use tokenizers::Tokenizer;

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
    /// Number of synthetic prompts.
    #[arg(long, default_value_t = 32)]
    prompts: usize,
    /// Tokens generated per prompt.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Target precision: P(accepted | confidence ≥ threshold).
    #[arg(long, default_value_t = 0.5)]
    target: f32,
    /// Positions with fewer samples are never pruned.
    #[arg(long, default_value_t = 50)]
    min_samples: usize,
    /// Replace an existing calibration.
    #[arg(long)]
    force: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model_dir = match &a.model {
        Some(d) => d.clone(),
        None => crate::default_model::ensure(false)?,
    };
    let model = Model::load(&model_dir).with_context(|| format!("loading {}", model_dir.display()))?;
    let ddir = if a.drafter == "default" {
        crate::default_model::ensure_drafter(&model_dir, false)?
    } else {
        PathBuf::from(&a.drafter)
    };
    let mut drafter = DSparkDrafter::load(&ddir, model.config())
        .with_context(|| format!("loading the DSpark drafter in {}", ddir.display()))?;
    if drafter.config().sts.is_some() && !a.force {
        bail!("{} already has calibrated thresholds — pass --force to recalibrate", ddir.display());
    }
    let v = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = match &a.prompt_file {
        Some(f) => {
            let tok_path = model_dir.join("tokenizer.json");
            let tok = Tokenizer::from_file(&tok_path).map_err(|e| anyhow::anyhow!("{}: {e}", tok_path.display()))?;
            let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    tok.encode(l, true)
                        .map(|e| e.get_ids().to_vec())
                        .map_err(|e| anyhow::anyhow!("encoding {l:?}: {e}"))
                })
                .collect::<Result<_>>()?
        }
        None => (0..a.prompts as u32).map(|i| (0..8).map(|j| 4 + (i * 131 + j * 29 + 7) % (v - 4)).collect()).collect(),
    };
    if prompts.is_empty() {
        bail!("no prompts");
    }
    let gamma = drafter.gamma();
    let cfg = SpecConfig {
        generate: GenerateConfig {
            max_tokens: a.tokens,
            stop_tokens: model.config().eos_token_ids.clone(),
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
