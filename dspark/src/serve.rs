//! `dspark serve`: the OpenAI-compatible HTTP server (the `serve` crate) on a checkpoint, with
//! speculative decoding when a drafter is given.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use mlx_core::Device;
use serve::{Engine, EngineConfig};

/// Arguments of `dspark serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Checkpoint directory (config.json, model*.safetensors, tokenizer.json). Default: the
    /// embedded tiny model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Decode speculatively with this drafter: a DSpark or DeepSpec checkpoint directory, or
    /// `default` for the embedded default drafter, or `none` for plain decoding. Absent: the
    /// default drafter with the default model, plain decoding with --model.
    #[arg(long)]
    drafter: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0 picks a free one; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests decoded at once; more wait in arrival order. Each speculative one holds its own
    /// drafter copy.
    #[arg(long, default_value_t = 4)]
    max_concurrency: usize,
    /// Drafts per round (default: the drafter's block size). Needs a drafter.
    #[arg(long)]
    gamma: Option<usize>,
    /// Prompt prefix states kept for reuse (0 turns the prompt cache off).
    #[arg(long, default_value_t = 8)]
    prompt_cache: usize,
    /// Prefill chunk size in tokens (the prompt cache reuses prefixes on this grid).
    #[arg(long, default_value_t = 2048)]
    prefill_step: usize,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = serve::DEFAULT_BODY_LIMIT)]
    max_body_bytes: usize,
    /// The model id clients name (default: the checkpoint directory's name).
    #[arg(long)]
    model_id: Option<String>,
    /// cpu or gpu (Metal on Apple Silicon, CUDA with the mlx-cuda wheels).
    #[arg(long, default_value = "cpu")]
    device: Device,
    /// Compute dtype, as for `dspark generate` (auto: f32 on the CPU when it fits).
    #[arg(long, default_value = "auto")]
    dtype: gemma4::ComputeDtype,
    /// Verify windows: `auto` uses the throughput schedule for requests of a mode the drafter
    /// is calibrated for when the model has a verify-cost profile for this device (`dspark
    /// calibrate`, `dspark profile`); `full` verifies whole blocks.
    #[arg(long, value_enum, default_value = "auto")]
    schedule: crate::schedule::Schedule,
}

/// Loads the model (and drafters), then serves until SIGINT/SIGTERM.
pub fn run(a: Args) -> Result<()> {
    if a.max_concurrency == 0 {
        bail!("--max-concurrency must be at least 1");
    }
    if a.prefill_step == 0 {
        bail!("--prefill-step must be at least 1");
    }
    let drafter_arg = crate::paths::drafter_choice(a.model.as_deref(), a.drafter.as_deref());
    if drafter_arg.is_none() && a.gamma.is_some() {
        bail!("--gamma needs a drafter (--drafter DIR, or the default model's own drafter)");
    }
    let dir = crate::paths::select_target(a.model.as_deref(), drafter_arg, a.device)?;
    let drafter_dir = drafter_arg.map(crate::paths::drafter_dir).transpose()?;
    let model_id = match a.model_id {
        Some(id) => id,
        None if a.model.is_none() => "dspark-default".to_string(),
        None => dir.file_name().map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
    };
    let mut cfg = EngineConfig::new(dir.clone(), model_id);
    cfg.drafter_dir = drafter_dir;
    cfg.max_concurrency = a.max_concurrency;
    cfg.gamma = a.gamma;
    cfg.prompt_cache = a.prompt_cache;
    cfg.prefill_step = a.prefill_step;
    cfg.dtype = a.dtype;
    cfg.throughput_schedule = match a.schedule {
        crate::schedule::Schedule::Auto => true,
        crate::schedule::Schedule::Full => false,
        crate::schedule::Schedule::Throughput => {
            bail!("--schedule throughput: the server uses it per request mode where it can (auto) — pass auto or full")
        }
    };
    eprintln!("dspark serve: loading {}", dir.display());
    let engine = Engine::start(cfg).with_context(|| format!("starting the engine on {}", dir.display()))?;
    let info = engine.info();
    eprintln!(
        "dspark serve: model '{}' | {} | context {} | {} session(s) at once",
        info.id,
        if info.speculative { "speculative" } else { "plain decoding" },
        info.context,
        a.max_concurrency
    );
    serve::server::run(engine, SocketAddr::new(a.host, a.port), a.max_body_bytes, |addr| {
        // On stdout, so a script that asked for port 0 can read the port.
        println!("dspark serve: listening on http://{addr}");
    })?;
    Ok(())
}
