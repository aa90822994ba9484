//! Lossless speculative decoding with DSpark drafters: draft, verify, accept, rollback.
//!
//! The drafters and decode loops land with the spec-decode issue; the crate exists now so the
//! dependency direction (mlx-core ← gemma4 ← spec-decode) is fixed from the start.
#![forbid(unsafe_code)]

pub mod accept;
