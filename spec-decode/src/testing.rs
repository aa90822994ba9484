//! Fixtures and switches for tests and gates (the `testing` feature): never part of the API a
//! user decodes with.

use gemma4::Model;

use crate::decode::{decode_with_rule, Prefilled, SpecConfig, SpecOutput};
use crate::drafter::Drafter;
use crate::error::Result;

pub use crate::deepspec::synthetic::{write_synthetic_deepspec, SyntheticDeepSpec};
pub use crate::rule::VerifyRule;

/// [`crate::decode_from`] under a chosen verify rule, so a statistical gate can show that it
/// rejects a broken verifier.
pub fn decode_from_with_rule(
    target: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    cfg: &SpecConfig,
    rule: VerifyRule,
    on_token: impl FnMut(u32),
) -> Result<SpecOutput> {
    decode_with_rule(target, drafter, pre, pre.ctx.clone(), cfg, rule, on_token)
}
