//! What dspark's two front ends share: one request's decoding ([`Session`]), the serving
//! engine that interleaves sessions on one model ([`Engine`]), and the rules both apply to
//! prompts and output. `dspark generate` (the CLI) runs one session to the end; `dspark-serve`
//! (the HTTP server) hands requests to an engine. Neither this crate nor the CLI links an
//! async runtime or an HTTP stack.
//!
//! - [`session`]: one request's decoding, a round at a time; the one decoding path of the
//!   front ends.
//! - [`mod@engine`]: the worker thread that owns the model and interleaves sessions.
//! - [`prompt_cache`]: exact reuse of earlier prompts' prefixes.
//! - [`text`]: token ids to streamed text, with stop strings.
//! - [`chat`]: conversations to prompt ids.
//! - [`selection`], [`schedule`], [`default_model`]: what both front ends decide before
//!   decoding: which target and drafter (the embedded default unless told otherwise), and
//!   which verify windows.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "clap")]
pub mod args;
pub mod batch;
pub mod batch_schedule;
pub mod chat;
pub mod default_model;
pub mod engine;
mod error;
pub mod plain;
pub mod prompt_cache;
pub mod schedule;
pub mod selection;
pub mod session;
pub mod starting;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;

pub use engine::{Engine, EngineConfig, Event, Events, Job, ModelInfo, RequestCounts};
pub use error::{Error, Result};
pub use gemma4::generate::FinishReason;
pub use schedule::Schedule;
pub use session::{Outcome, Request, Session, StepOut};
