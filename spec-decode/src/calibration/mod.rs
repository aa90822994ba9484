//! Calibration of a drafter's confidence head: the pruning thresholds (`fit_thresholds`),
//! sequential temperature scaling (`sts`) with per-position isotonic survival maps
//! (`survival_map`), the reliability measures (`reliability`) and per-position reports
//! (`report`) of the held-out rounds, the run that fits them all from speculative decodes or a
//! rounds file (`pipeline`, `rounds_file`), and where a checkpoint without a descriptor of its
//! own keeps the result (the sidecar).

mod error;
pub(crate) mod pipeline;
pub mod reliability;
pub mod report;
pub mod rounds_file;
mod sidecar;
pub mod sts;
pub mod survival_map;
mod thresholds;

pub use error::CalibrationError;
pub use pipeline::{calibrate, check_drafter, CalibrationRun, CalibrationSettings, ModeFit, Progress, RoundSource};
pub use sidecar::{check, read_sidecar, write_sidecar, SIDECAR_FILE};
pub use thresholds::{fit_thresholds, ConfSample};
