//! `dspark-serve` (and `dspark serve`, which runs it): the command line of the server. Flags are
//! checked first, then the model (and drafters) load and the server runs until SIGINT/SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use engine::args::{ComputeArgs, DrafterArg, TargetArg};
use engine::selection::{drafter_choice, drafter_dir, select_target};
use engine::{Engine, EngineConfig, Error, Result, Schedule};

use crate::router::RouterConfig;
use crate::server::ServerConfig;

/// Arguments of `dspark-serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    target: TargetArg,
    #[command(flatten)]
    drafter: DrafterArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded at once, all stepped together in one batched target forward; more wait in
    /// arrival order. Speculative ones hold forks of one drafter (its weights are shared).
    #[arg(long, default_value_t = 16)]
    max_concurrency: usize,
    /// Drafts per round (default: the drafter's block size). Needs a drafter.
    #[arg(long)]
    gamma: Option<usize>,
    /// Prompt prefix states kept for reuse (0 turns the prompt cache off).
    #[arg(long, default_value_t = 8)]
    prompt_cache: usize,
    /// Prefill chunk size in tokens: prompts are prefilled one chunk per engine iteration while
    /// other requests decode, and the prompt cache reuses prefixes on this grid (default: the
    /// largest chunk costing at most two decode steps, measured at start).
    #[arg(long)]
    prefill_step: Option<usize>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = crate::DEFAULT_BODY_LIMIT)]
    max_body_bytes: usize,
    /// Seconds a client has to send a request's whole body (408 past it).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,
    /// Seconds a client has to send a request's head (the connection closes past it).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    header_timeout_secs: u64,
    /// Seconds a keep-alive connection may wait idle for its next request.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_secs: u64,
    /// Seconds a shutdown (SIGINT/SIGTERM) waits for requests in flight before closing their
    /// connections.
    #[arg(long, default_value_t = 10)]
    shutdown_grace_secs: u64,
    /// Require `Authorization: Bearer KEY` on every route but `GET /health`.
    #[arg(long, env = "DSPARK_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model id clients name (default: the checkpoint directory's name).
    #[arg(long)]
    model_id: Option<String>,
    #[command(flatten)]
    compute: ComputeArgs,
    /// Verify windows: `auto` uses the throughput schedule for requests of a mode the drafter
    /// is calibrated for when the model has a verify-cost profile for this device (`dspark
    /// calibrate`, `dspark profile`); `full` verifies whole blocks.
    #[arg(long, value_enum, default_value = "auto")]
    schedule: Schedule,
}

fn refuse(what: &'static str, detail: &str) -> Error {
    Error::Settings { what, detail: detail.into() }
}

/// Checks the flags, loads the model (and drafters), then serves until SIGINT/SIGTERM;
/// `on_listening` gets the address once the server listens.
pub fn run(a: Args, on_listening: impl FnOnce(SocketAddr)) -> Result<()> {
    if a.max_concurrency == 0 {
        return Err(refuse("--max-concurrency", "must be at least 1"));
    }
    if a.prefill_step == Some(0) {
        return Err(refuse("--prefill-step", "must be at least 1"));
    }
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        return Err(refuse("--api-key", "must not be empty"));
    }
    let throughput_schedule = match a.schedule {
        Schedule::Auto => true,
        Schedule::Full => false,
        Schedule::Throughput => {
            return Err(refuse(
                "--schedule throughput",
                "the server uses it per request mode where it can (auto) — pass auto or full",
            ))
        }
    };
    let drafter_arg = drafter_choice(a.target.model.as_deref(), a.drafter.drafter.as_deref());
    if drafter_arg.is_none() && a.gamma.is_some() {
        return Err(refuse("--gamma", "needs a drafter (--drafter DIR, or the default model's own drafter)"));
    }
    let dir = select_target(a.target.model.as_deref(), drafter_arg, a.compute.device)?;
    let model_id = match a.model_id {
        Some(id) => id,
        None if a.target.model.is_none() => "dspark-default".to_string(),
        None => dir.file_name().map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
    };
    let mut cfg = EngineConfig::new(dir.clone(), model_id);
    cfg.drafter_dir = drafter_arg.map(drafter_dir).transpose()?;
    cfg.max_concurrency = a.max_concurrency;
    cfg.gamma = a.gamma;
    cfg.prompt_cache = a.prompt_cache;
    cfg.prefill_step = a.prefill_step;
    cfg.dtype = a.compute.dtype;
    cfg.throughput_schedule = throughput_schedule;
    tracing::info!("loading {}", dir.display());
    let engine = Engine::start(cfg)?;
    let info = engine.info();
    tracing::info!(
        "model '{}' | {} | context {} | {} session(s) at once",
        info.id,
        if info.speculative { "speculative" } else { "plain decoding" },
        info.context,
        a.max_concurrency
    );
    let server = ServerConfig {
        router: RouterConfig {
            body_limit: a.max_body_bytes,
            body_timeout: Duration::from_secs(a.body_timeout_secs),
            api_key: a.api_key,
        },
        header_timeout: Duration::from_secs(a.header_timeout_secs),
        idle_timeout: Duration::from_secs(a.idle_timeout_secs),
        shutdown_grace: Duration::from_secs(a.shutdown_grace_secs),
    };
    crate::server::run(engine, SocketAddr::new(a.host, a.port), server, on_listening)
}
