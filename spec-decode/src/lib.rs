//! Lossless speculative decoding for gemma4 targets: drafters propose, the target scores the
//! anchor plus drafts in one forward, the verifier accepts a prefix and adds one recovered or
//! bonus token, and every cache rolls back the rejected tips.
//!
//! Greedy output is bit-identical to plain greedy decoding of the target, and sampled output
//! has exactly the target's distribution: the drafter changes speed, never what is emitted.
//!
//! ```no_run
//! use std::path::Path;
//! use gemma4::Model;
//! use spec_decode::{load_drafter, speculative_generate, SpecConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let target = Model::load(Path::new("gemma-4-e2b"))?;
//! let mut drafter = load_drafter(Path::new("gemma-4-e2b-dspark"), target.config())?;
//! let out = speculative_generate(&target, drafter.as_mut(), &[2, 651, 6037], &SpecConfig::default(), |_| {})?;
//! println!("{:?}\n{}", out.tokens, out.stats.summary());
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod accept;
pub mod calibration;
pub mod context_cache;
pub mod decode;
pub mod deepspec;
pub mod draft_cap;
pub mod drafter;
pub mod dspark;
mod error;
pub mod loader;
pub mod oracle;
pub mod probs;
pub mod profile;
pub mod reliability;
pub mod request_rate;
mod rule;
pub mod schedule;
pub mod stats;
pub mod sts;
pub mod survival_map;
#[cfg(feature = "testing")]
pub mod testing;
pub mod throughput;
pub mod verify;

pub use decode::{
    decode_from, prefill, prefill_from, speculative_generate, FinishReason, Prefilled, PrefixState, SpecConfig,
    SpecOutput, SpecRounds,
};
pub use drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
pub use error::{Error, Result};
pub use loader::{detect, load_drafter, load_drafter_as, DrafterKind};
pub use schedule::{Pruning, ThroughputPlan};
pub use stats::SpecStats;
