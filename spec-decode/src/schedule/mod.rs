//! How many drafts a round verifies: confidence pruning by thresholds, or the hardware-aware
//! throughput schedule (`throughput`) with its per-request draft cap (`draft_cap`) and achieved
//! rate (`request_rate`), priced by the target's measured verify costs (`profile`). Every rule
//! only truncates a block at a stopping time, so speculative sampling stays exact.

pub mod batch;
pub mod draft_cap;
pub mod profile;
mod pruning;
pub mod request_rate;
pub mod throughput;

pub use pruning::{kept_len, Cut, Pruning, ThroughputPlan};
