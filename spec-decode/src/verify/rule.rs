//! The switch between the real verify rule and a deliberately broken one. Only the `testing`
//! feature exposes it: the statistical gate uses the broken rule to show that its test rejects
//! a verifier that is not lossless.

/// Which verify rule a round applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum VerifyRule {
    /// Exact verification: greedy prefix matching, or speculative sampling.
    #[default]
    Exact,
    /// Accept every draft (wrong on purpose).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    AcceptAll,
}
