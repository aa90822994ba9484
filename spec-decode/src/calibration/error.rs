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
    Settings {
        /// The setting's name.
        setting: &'static str,
        /// The value given, as text.
        value: String,
        /// Why it is refused.
        detail: String,
    },
    /// Pruning and scaling need confidences: the drafter gives none.
    #[error("{drafter} has no confidence head, so there is nothing to calibrate")]
    NoConfidence {
        /// The drafter's name.
        drafter: String,
    },
    /// Prompts alternate between the fitting half and the held-out half: one is not enough.
    #[error("{prompts} prompt(s): calibration needs at least 2 (half fit, half held out)")]
    TooFewPrompts {
        /// Prompts given.
        prompts: usize,
    },
    /// A speculative run of the calibration failed.
    #[error("calibration run {mode}, prompt {prompt}")]
    Decode {
        /// The mode, `greedy` or `sampled, T = t`.
        mode: String,
        /// 1-based.
        prompt: usize,
        /// The speculative-decoding error.
        source: Box<crate::Error>,
    },
    /// Every round of a mode came from fitting prompts.
    #[error("{mode}: no held-out rounds; calibration needs at least 2 prompts")]
    NoHeldOut {
        /// The mode, `greedy` or `sampled, T = t`.
        mode: String,
    },
    /// The rounds file could not be read.
    #[error("reading {}", path.display())]
    Read {
        /// The rounds file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A rounds-file line that is not JSON of a round.
    #[error("{} line {line}: expected {{\"temperature\", \"prompt\", \"logits\", \"accepted\"}}", path.display())]
    NotARound {
        /// The rounds file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// A rounds-file line whose round does not fit the drafter's block.
    #[error(
        "{} line {line}: a round of {drafts} drafts with {accepted} accepted; expected 1 to gamma = {gamma} drafts \
         and at most that many accepted",
        path.display()
    )]
    BadRound {
        /// The rounds file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Drafts in the round.
        drafts: usize,
        /// Drafts the round accepted.
        accepted: usize,
        /// The drafter's block size γ.
        gamma: usize,
    },
    /// A temperature asked for that the rounds file holds no rounds of.
    #[error("{}: no rounds at sampling temperature {temperature}", path.display())]
    NoRoundsAt {
        /// The rounds file.
        path: PathBuf,
        /// The sampling temperature asked for.
        temperature: f64,
    },
    /// A round that JSON cannot hold.
    #[error("writing a round as JSON")]
    Write(#[source] serde_json::Error),
}
