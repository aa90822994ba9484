//! The calibration run behind `dspark calibrate`: speculative decodes of held-out prompts
//! (greedy and sampled: acceptance differs) give, per verify round, the confidence logits of
//! the drafts and how many were accepted; or a rounds file from an earlier run gives them. From
//! them, per mode, STS and the isotonic survival maps are fitted on the even prompts and
//! reported on the odd ones (ECE, AUROC and Brier score per block position: raw, scaled, and
//! after the maps); the pruning thresholds are fitted on the greedy rounds (the sampled ones
//! when only those are calibrated). The result is the checkpoint's calibration block.

use std::path::Path;

use gemma4::generate::GenerateConfig;
use gemma4::sampling::SamplerConfig;
use gemma4::Model;

use super::error::CalibrationError;
use super::report::{report, PositionReport};
use super::rounds_file::{read_rounds, RoundLine};
use super::sts::{rounds_from_samples, RoundSample, Sts};
use super::thresholds::{fit_thresholds, ConfSample};
use crate::decode::{speculative_generate, SpecConfig};
use crate::drafter::Drafter;
use crate::drafters::dspark::{Calibration, StsFit, CALIBRATION_VERSION};
use crate::schedule::Pruning;

/// Settings of a calibration run.
#[derive(Clone, Debug, PartialEq)]
pub struct CalibrationSettings {
    /// Sampling temperatures to calibrate for: 0 is greedy; one positive temperature gives the
    /// sampled fit.
    pub temperatures: Vec<f64>,
    /// Tokens generated per prompt (at least 1; decodes only).
    pub tokens: usize,
    /// Tokens that end a decode.
    pub stop_tokens: Vec<u32>,
    /// Precision of the pruning thresholds: P(accepted | confidence ≥ threshold), in (0, 1].
    pub target: f32,
    /// Positions with fewer samples are never pruned and keep T = 1 and no survival map.
    pub min_samples: usize,
    /// Positions fitted on fewer rounds get no isotonic survival map, only the temperature and
    /// shift (a map fitted on a few hundred prompts learns their noise).
    pub min_map_rounds: usize,
    /// Keep every round in [`CalibrationRun::rounds`] (for a rounds file).
    pub keep_rounds: bool,
}

impl CalibrationSettings {
    /// Checks the settings on their own; the error names the setting.
    pub fn check(&self) -> Result<(), CalibrationError> {
        let bad = |setting, value: String, detail: &str| {
            Err(CalibrationError::Settings { setting, value, detail: detail.to_string() })
        };
        if !(self.target.is_finite() && self.target > 0.0 && self.target <= 1.0) {
            return bad("target", self.target.to_string(), "expected a precision in (0, 1]");
        }
        if self.tokens == 0 {
            return bad("tokens", "0".into(), "expected at least 1 token per prompt");
        }
        let temps = format!("{:?}", self.temperatures);
        if let Some(t) = self.temperatures.iter().find(|t| !(t.is_finite() && **t >= 0.0)) {
            let detail = format!("{t} is not a temperature (expected 0 for greedy, or positive)");
            return bad("temperatures", temps, &detail);
        }
        let greedy = self.temperatures.iter().filter(|t| **t == 0.0).count();
        let sampled = self.temperatures.len() - greedy;
        if greedy > 1 || sampled > 1 || greedy + sampled == 0 {
            return bad("temperatures", temps, "expected 0 (greedy), one positive temperature (sampled), or both");
        }
        Ok(())
    }

    /// Whether the rounds at `temperature` give the pruning thresholds: the greedy ones, or the
    /// sampled ones when greedy decoding is not calibrated.
    fn thresholds_from(&self, temperature: f64) -> bool {
        temperature == 0.0 || !self.temperatures.contains(&0.0)
    }
}

/// Where the verify rounds come from.
#[derive(Clone, Copy, Debug)]
pub enum RoundSource<'a> {
    /// Speculative decodes of these prompts (at least 2), one per prompt and temperature, the
    /// i-th seeded with i.
    Decode(&'a [Vec<u32>]),
    /// The rounds a rounds file holds ([`read_rounds`]); nothing is decoded, and the prompts'
    /// halves and the temperatures are read from it.
    File(&'a Path),
}

/// What a calibration run reports while it runs.
#[derive(Debug)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// A calibration decode finished: `prompt` (1-based) of `prompts` in `mode`, with `rounds`
    /// verify rounds of the mode so far.
    Decoded {
        /// The mode, `greedy` or `sampled, T = t`.
        mode: &'a str,
        /// 1-based index of the prompt just decoded.
        prompt: usize,
        /// Prompts in this mode.
        prompts: usize,
        /// Verify rounds of the mode so far.
        rounds: usize,
    },
    /// A mode is fitted and reported on its held-out rounds.
    Fitted(&'a ModeFit),
}

/// One mode's calibration (greedy, or sampled at one temperature): the fit and its reports on
/// the held-out rounds.
#[derive(Clone, Debug)]
pub struct ModeFit {
    /// `greedy` or `sampled, T = t`.
    pub label: String,
    /// The fit as the checkpoint stores it, with the held-out ECE per position.
    pub fit: StsFit,
    /// The fitted scaling as the runtime applies it (temperatures, shifts, survival maps).
    pub sts: Sts,
    /// Raw confidences, the temperatures and shifts alone, and the whole calibration.
    pub before: Vec<PositionReport>,
    /// Reports after temperatures and shifts alone, per block position.
    pub scaled: Vec<PositionReport>,
    /// Reports after the whole calibration (scaling plus survival maps), per block position.
    pub after: Vec<PositionReport>,
    /// Block positions (0-based) fitted on too few rounds for a survival map.
    pub unmapped: Vec<usize>,
    /// The held-out rounds the reports were computed on.
    pub held_out: Vec<RoundSample>,
}

/// The result of a calibration run.
#[derive(Clone, Debug)]
pub struct CalibrationRun {
    /// One per temperature, in the order asked.
    pub modes: Vec<ModeFit>,
    /// The checkpoint's calibration block: thresholds and the fit of each mode.
    pub calibration: Calibration,
    /// Every verify round, mode by mode, when [`CalibrationSettings::keep_rounds`].
    pub rounds: Vec<RoundLine>,
}

/// Calibrates `drafter`'s confidence for `target` from the rounds of `source`; `progress` sees
/// each finished decode and each fitted mode.
pub fn calibrate(
    target: &Model,
    drafter: &mut dyn Drafter,
    source: RoundSource<'_>,
    settings: &CalibrationSettings,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<CalibrationRun, CalibrationError> {
    settings.check()?;
    check_drafter(drafter)?;
    let gamma = drafter.gamma();
    let stored = match source {
        RoundSource::File(path) => read_rounds(path, gamma)?,
        RoundSource::Decode(prompts) if prompts.len() < 2 => {
            return Err(CalibrationError::TooFewPrompts { prompts: prompts.len() })
        }
        RoundSource::Decode(_) => Vec::new(),
    };
    let mut modes = Vec::new();
    // Per-position samples for the pruning thresholds.
    let mut threshold_samples = Vec::new();
    let mut kept = Vec::new();
    for &temperature in &settings.temperatures {
        let samples = settings.thresholds_from(temperature).then_some(&mut threshold_samples);
        let rounds = match source {
            RoundSource::File(path) => {
                let rounds: Vec<(usize, RoundSample)> =
                    stored.iter().filter(|l| l.temperature == temperature).map(|l| (l.prompt, l.sample())).collect();
                if rounds.is_empty() {
                    return Err(CalibrationError::NoRoundsAt { path: path.to_path_buf(), temperature });
                }
                if let Some(s) = samples {
                    s.extend(rounds.iter().flat_map(|(_, r)| r.conf_samples()));
                }
                rounds
            }
            RoundSource::Decode(prompts) => {
                decode_mode(target, drafter, prompts, temperature, settings, samples, &mut progress)?
            }
        };
        if settings.keep_rounds {
            kept.extend(rounds.iter().map(|(prompt, r)| RoundLine {
                temperature,
                prompt: *prompt,
                logits: r.logits.clone(),
                accepted: r.accepted,
            }));
        }
        let m = fit_mode(temperature, rounds, gamma, settings)?;
        progress(Progress::Fitted(&m));
        modes.push(m);
    }
    let thresholds = fit_thresholds(&threshold_samples, gamma, settings.target, settings.min_samples);
    let mode =
        |greedy: bool| modes.iter().find(|m| (m.fit.sampling_temperature == 0.0) == greedy).map(|m| m.fit.clone());
    let calibration = Calibration {
        version: CALIBRATION_VERSION,
        thresholds,
        target: settings.target,
        samples: threshold_samples.len(),
        greedy: mode(true),
        sampled: mode(false),
    };
    Ok(CalibrationRun { modes, calibration, rounds: kept })
}

/// Calibration needs the drafter's confidences.
pub fn check_drafter(drafter: &dyn Drafter) -> Result<(), CalibrationError> {
    if drafter.has_confidence() {
        Ok(())
    } else {
        Err(CalibrationError::NoConfidence { drafter: drafter.name() })
    }
}

/// The name of the mode calibrated at `temperature`.
fn mode_label(temperature: f64) -> String {
    if temperature == 0.0 {
        "greedy".to_string()
    } else {
        format!("sampled, T = {temperature}")
    }
}

/// The verify rounds of every prompt decoded at `temperature`, each with its prompt's index;
/// the loop's own per-position samples go to `threshold_samples` when given.
fn decode_mode(
    target: &Model,
    drafter: &mut dyn Drafter,
    prompts: &[Vec<u32>],
    temperature: f64,
    settings: &CalibrationSettings,
    mut threshold_samples: Option<&mut Vec<ConfSample>>,
    progress: &mut impl FnMut(Progress<'_>),
) -> Result<Vec<(usize, RoundSample)>, CalibrationError> {
    let mode = mode_label(temperature);
    let cfg = SpecConfig {
        generate: GenerateConfig {
            max_tokens: settings.tokens,
            stop_tokens: settings.stop_tokens.clone(),
            sampler: SamplerConfig { temperature, ..Default::default() },
            ..Default::default()
        },
        gamma: Some(drafter.gamma()),
        // Active with no threshold: confidences are read, nothing is pruned.
        pruning: Pruning::Thresholds(vec![]),
    };
    let mut rounds = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        let cfg = SpecConfig { generate: GenerateConfig { seed: i as u64, ..cfg.generate.clone() }, ..cfg.clone() };
        let out = speculative_generate(target, drafter, p, &cfg, |_| {}).map_err(|source| {
            CalibrationError::Decode { mode: mode.clone(), prompt: i + 1, source: Box::new(source) }
        })?;
        rounds.extend(rounds_from_samples(&out.conf_samples).into_iter().map(|r| (i, r)));
        if let Some(s) = threshold_samples.as_deref_mut() {
            s.extend(out.conf_samples);
        }
        progress(Progress::Decoded { mode: &mode, prompt: i + 1, prompts: prompts.len(), rounds: rounds.len() });
    }
    Ok(rounds)
}

/// Fits a mode on the rounds of its even prompts and reports on the odd ones.
fn fit_mode(
    temperature: f64,
    rounds: Vec<(usize, RoundSample)>,
    gamma: usize,
    settings: &CalibrationSettings,
) -> Result<ModeFit, CalibrationError> {
    // Prompts alternate between the fitting half and the held-out half.
    let (fit_rounds, held_out): (Vec<_>, Vec<_>) = rounds.into_iter().partition(|(i, _)| i % 2 == 0);
    let fit_rounds: Vec<RoundSample> = fit_rounds.into_iter().map(|(_, r)| r).collect();
    let held_out: Vec<RoundSample> = held_out.into_iter().map(|(_, r)| r).collect();
    let label = mode_label(temperature);
    if held_out.is_empty() {
        return Err(CalibrationError::NoHeldOut { mode: label });
    }
    let sts = Sts::fit(&fit_rounds, gamma, settings.min_samples, settings.min_map_rounds);
    let unmapped = (0..gamma).filter(|&k| sts.maps.get(k).is_none_or(|m| m.knots.is_empty())).collect();
    let before = report(&Sts::identity(gamma), &held_out, gamma);
    let scaled = report(&sts.scaling_only(), &held_out, gamma);
    let after = report(&sts, &held_out, gamma);
    let fit = StsFit {
        temperatures: sts.temperatures.clone(),
        shifts: sts.shifts.clone(),
        sampling_temperature: temperature as f32,
        rounds: fit_rounds.len(),
        survival_maps: sts.maps.iter().map(|m| m.knots.clone()).collect(),
        ece_before: before.iter().map(|r| r.ece as f32).collect(),
        ece_scaled: scaled.iter().map(|r| r.ece as f32).collect(),
        ece_after: after.iter().map(|r| r.ece as f32).collect(),
    };
    Ok(ModeFit { label, fit, sts, before, scaled, after, unmapped, held_out })
}
