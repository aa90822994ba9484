//! Calibration of a drafter's confidence head: the pruning thresholds (`fit_thresholds`),
//! sequential temperature scaling (`sts`) with per-position isotonic survival maps
//! (`survival_map`), the reliability measures the reports use (`reliability`), and where a
//! checkpoint without a descriptor of its own keeps the result (the sidecar).

pub mod reliability;
mod sidecar;
pub mod sts;
pub mod survival_map;
mod thresholds;

pub use sidecar::{check, read_sidecar, write_sidecar, SIDECAR_FILE};
pub use thresholds::{fit_thresholds, ConfSample};
