//! DSpark drafters: the v2 KV-injection module and its checkpoint format.

pub mod config;
mod model;

pub use config::{Calibration, DSparkConfig, Descriptor};
pub use model::DSparkDrafter;
