//! Lossless speculative decoding for gemma4 targets: drafters propose, the target scores the
//! anchor plus drafts in one forward, the verifier accepts a prefix and adds one recovered or
//! bonus token, and every cache rolls back the rejected tips.
#![forbid(unsafe_code)]

pub mod accept;
pub mod calibration;
pub mod context_cache;
pub mod decode;
pub mod deepspec;
pub mod drafter;
pub mod dspark;
mod error;
pub mod loader;
pub mod oracle;
pub mod probs;
pub mod schedule;
pub mod stats;
pub mod verify;

pub use decode::{decode_from, prefill, speculative_generate, FinishReason, Prefilled, SpecConfig, SpecOutput};
pub use drafter::{DraftRequest, DraftSampling, Drafter, Proposal};
pub use error::{Error, Result};
pub use schedule::Pruning;
pub use stats::SpecStats;
