//! Errors of a calibration run. Sources are kept as chains, never re-stringified.

use std::path::PathBuf;

/// What stops a calibration run: settings out of range, a rounds file that is not one, too
/// little data to fit and hold out, or a failed calibration decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrationError {
    /// A setting out of range; `setting` is the field's name (`target`, `tokens`,
    /// `temperatures`).
    #[error("{setting} {value}: {detail}")]
    Settings { setting: &'static str, value: String, detail: String },
    /// Pruning and scaling need confidences: the drafter gives none.
    #[error("{drafter} has no confidence head, so there is nothing to calibrate")]
    NoConfidence { drafter: String },
    /// Prompts alternate between the fitting half and the held-out half: one is not enough.
    #[error("{prompts} prompt(s): calibration needs at least 2 (half fit, half held out)")]
    TooFewPrompts { prompts: usize },
    /// A speculative run of the calibration failed.
    #[error("calibration run {mode}, prompt {prompt}")]
    Decode {
        mode: String,
        /// 1-based.
        prompt: usize,
        source: Box<crate::Error>,
    },
    /// Every round of a mode came from fitting prompts.
    #[error("{mode}: no held-out rounds; calibration needs at least 2 prompts")]
    NoHeldOut { mode: String },
    #[error("reading {}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A rounds-file line that is not JSON of a round.
    #[error("{} line {line}: expected {{\"temperature\", \"prompt\", \"logits\", \"accepted\"}}", path.display())]
    NotARound { path: PathBuf, line: usize, source: serde_json::Error },
    /// A rounds-file line whose round does not fit the drafter's block.
    #[error(
        "{} line {line}: a round of {drafts} drafts with {accepted} accepted; expected 1 to gamma = {gamma} drafts \
         and at most that many accepted",
        path.display()
    )]
    BadRound { path: PathBuf, line: usize, drafts: usize, accepted: usize, gamma: usize },
    /// A temperature asked for that the rounds file holds no rounds of.
    #[error("{}: no rounds at sampling temperature {temperature}", path.display())]
    NoRoundsAt { path: PathBuf, temperature: f64 },
    /// A round that JSON cannot hold.
    #[error("writing a round as JSON")]
    Write(#[source] serde_json::Error),
}
