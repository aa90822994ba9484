//! DSpark drafters: the v2 KV-injection module, its checkpoint format, and a counting-fitted
//! variant for the embedded default.

pub mod confidence;
pub mod config;
mod fit;
mod model;
pub mod train;

pub use config::{
    param_kind, write_calibration, Calibration, DSparkConfig, Descriptor, Dims, ParamKind, StsFit, CALIBRATION_VERSION,
};
pub use fit::fit_bigram_drafter;
pub use model::{propose_batch, DSparkDrafter};
