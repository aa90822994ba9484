//! Verification of a round: the acceptance rules on the host (`accept`, the property-tested
//! reference), the one processing pipeline the target's and the drafter's rows both go through
//! (`probs`), and the device verdicts the decode loop runs (greedy prefix matching and
//! speculative sampling, one host read per round). See docs/verify.md.

pub mod accept;
pub mod probs;
pub(crate) mod rule;
mod verdict;

pub use verdict::{accept_flags, residual_weights};
pub(crate) use verdict::{greedy_verdict, sampled_verdict, Judged};
