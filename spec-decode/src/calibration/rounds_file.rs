//! The rounds file: every verify round of a calibration run, one JSON object a line
//! (`temperature`, `prompt`, `logits`, `accepted`), to study or refit a calibration without
//! rerunning the decodes.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::CalibrationError;
use super::sts::RoundSample;

/// One verify round as a rounds-file line: the sampling temperature and prompt it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundLine {
    /// Sampling temperature of the run (0 = greedy).
    pub temperature: f64,
    /// Index of the prompt (even: fitted on, odd: held out).
    pub prompt: usize,
    /// Confidence logits of the verified drafts, block order // `[d]`
    pub logits: Vec<f32>,
    /// How many leading drafts were accepted (0..=d).
    pub accepted: usize,
}

impl RoundLine {
    /// The round as calibration fits it.
    pub fn sample(&self) -> RoundSample {
        RoundSample { logits: self.logits.clone(), accepted: self.accepted }
    }
}

/// Every round a rounds file holds; an error names the line that is not a round of at most
/// `gamma` drafts.
pub fn read_rounds(path: &Path, gamma: usize) -> Result<Vec<RoundLine>, CalibrationError> {
    let text = mlx_core::files::read_text(path, mlx_core::files::LARGE_TEXT_LIMIT)
        .map_err(|source| CalibrationError::Read { path: path.to_path_buf(), source })?;
    let mut rounds = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let l: RoundLine = serde_json::from_str(line).map_err(|source| CalibrationError::NotARound {
            path: path.to_path_buf(),
            line: n + 1,
            source,
        })?;
        if l.logits.is_empty() || l.logits.len() > gamma || l.accepted > l.logits.len() {
            return Err(CalibrationError::BadRound {
                path: path.to_path_buf(),
                line: n + 1,
                drafts: l.logits.len(),
                accepted: l.accepted,
                gamma,
            });
        }
        rounds.push(l);
    }
    Ok(rounds)
}

/// The text of a rounds file holding `rounds`, one line each.
pub fn rounds_text(rounds: &[RoundLine]) -> Result<String, CalibrationError> {
    let mut text = String::new();
    for r in rounds {
        text.push_str(&serde_json::to_string(r).map_err(CalibrationError::Write)?);
        text.push('\n');
    }
    Ok(text)
}
