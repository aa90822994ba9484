//! The drafters behind the [`crate::Drafter`] trait: DSpark (`dspark`), DeepSeek's DeepSpec
//! checkpoints (`deepspec`) and the target drafting for itself (`oracle`, for the gates); the
//! per-request context K/V both checkpoint drafters keep (`context_cache`); and the `loader`
//! that tells the checkpoint kinds apart.

pub mod context_cache;
pub mod deepspec;
pub mod dspark;
pub mod loader;
pub mod oracle;
