//! `dspark serve`: an OpenAI-compatible HTTP server (`/v1/completions`,
//! `/v1/chat/completions`, `/v1/models`, `/health`) over a Gemma-4 target, decoding
//! speculatively with a drafter when one is given, with streaming and per-request speculation
//! statistics in `usage.speculation`.
//!
//! - [`session`]: one request's decoding, a round at a time; the one decoding path shared with
//!   `dspark generate`.
//! - [`engine`]: the worker thread that owns the model and interleaves sessions.
//! - [`prompt_cache`]: exact reuse of earlier prompts' prefixes.
//! - [`params`], [`chat`], [`openai`], [`api_error`]: the OpenAI request and response shapes.
//! - [`mod@router`], [`server`]: axum routes, binding and graceful shutdown.
#![forbid(unsafe_code)]

pub mod api_error;
pub mod chat;
pub mod engine;
mod error;
pub mod openai;
pub mod params;
pub mod prompt_cache;
pub mod router;
pub mod server;
pub mod session;
pub mod text;

pub use engine::{Engine, EngineConfig, Event, Job, ModelInfo};
pub use error::{Error, Result};
pub use router::{router, DEFAULT_BODY_LIMIT};
pub use session::{Finish, Outcome, Request, Session, StepOut};
