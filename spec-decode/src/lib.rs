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
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod calibration;
pub mod decode;
pub(crate) mod drafter;
pub mod drafters;
mod error;
pub mod schedule;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verify;

// The flat module paths from before the folders, kept for callers.
pub use calibration::{reliability, sts, survival_map};
pub use drafters::{context_cache, deepspec, dspark, loader, oracle};
pub use schedule::{draft_cap, profile, request_rate, throughput};
pub use verify::{accept, probs};

pub use decode::{
    decode_from, prefill, prefill_from, speculative_generate, Drafting, FinishReason, Prefilled, PrefixState, Proposed,
    SpecConfig, SpecOutput, SpecRounds, Window,
};
pub use drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
pub use drafters::loader::{detect, load_drafter, load_drafter_as, DrafterKind};
pub use error::{Error, Result};
pub use schedule::{Pruning, ThroughputPlan};
pub use stats::SpecStats;
