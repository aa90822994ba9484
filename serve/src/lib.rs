//! `dspark-serve`: an OpenAI-compatible HTTP server (`/v1/completions`,
//! `/v1/chat/completions`, `/v1/models`, `/health`) over a Gemma-4 target, decoding
//! speculatively with a drafter when one is given, with streaming and per-request speculation
//! statistics in `usage.speculation`. The decoding itself (sessions, the engine, the prompt
//! cache) is the `engine` crate's; this crate is its HTTP front end.
//!
//! - [`params`], [`chat_request`], [`openai`], [`reply`], [`api_error`]: the OpenAI request
//!   and response shapes, tool calls and thinking included.
//! - [`mod@router`], [`body`], [`auth`], [`ids`]: axum routes, request body limits, the API
//!   key, response ids.
//! - [`server`], [`conn`]: binding, the accept loop with its per-connection timeouts, and
//!   graceful shutdown.
//! - [`launch`]: the `dspark-serve` command line (its binary only parses and prints).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api_error;
pub mod auth;
pub mod body;
pub mod chat_request;
pub mod conn;
pub mod ids;
pub mod launch;
pub mod openai;
pub mod params;
pub mod reply;
pub mod router;
pub mod server;

// The paths these had when they lived here.
pub use engine::{chat, prompt_cache, session, text};
pub use engine::{Engine, EngineConfig, Error, Event, Job, ModelInfo, Outcome, Request, Result, Session, StepOut};
pub use router::{router, RouterConfig, DEFAULT_BODY_LIMIT, DEFAULT_BODY_TIMEOUT};
pub use server::ServerConfig;
