//! `dspark-serve`: the OpenAI-compatible HTTP server on a Gemma-4 checkpoint (`dspark serve`
//! runs this binary).
#![forbid(unsafe_code)]

use std::io::IsTerminal;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "dspark-serve",
    version,
    about = "Serve a Gemma-4 model over an OpenAI-compatible HTTP API (/v1/completions, \
             /v1/chat/completions), decoding speculatively with --drafter"
)]
struct Cli {
    #[command(flatten)]
    args: serve::launch::Args,
}

fn main() -> anyhow::Result<()> {
    // Log lines on stderr; stdout carries only the address line. `DSPARK_LOG=debug` adds the
    // engine's per-step line (sessions, drafting, forward rows and times).
    let level = match std::env::var("DSPARK_LOG").as_deref() {
        Ok("debug") => tracing::Level::DEBUG,
        Ok("warn") => tracing::Level::WARN,
        _ => tracing::Level::INFO,
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    serve::launch::run(Cli::parse().args, |addr| {
        // On stdout, so a script that asked for port 0 can read the port.
        println!("dspark serve: listening on http://{addr}");
    })?;
    Ok(())
}
