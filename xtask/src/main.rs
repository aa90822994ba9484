//! `cargo xtask …`: the project's gates and benchmarks.
#![forbid(unsafe_code)]

mod bench;
mod chisq;
mod distribution_batched;
mod gates;
mod parity;
mod peers;
mod repeats;
mod serve_bench;
mod serve_gate;
mod steps;
mod train_default;
mod venv;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use mlx_core::Device;

#[derive(Parser)]
#[command(about = "dspark-rs gates and benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// gemma4 against mlx-lm 0.32.2 on tiny random checkpoints: bit-identical logits and tokens.
    Parity {
        /// Greedy/sampled tokens per job.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        /// Where checkpoints and reference outputs go.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The reference venv (created on first use).
        #[arg(long)]
        venv: Option<PathBuf>,
    },
    /// Speed against mlx-lm, verify cost v(k), speculative speedup; writes target/bench/bench.json.
    Bench {
        /// A small checkpoint instead of the mid-size one (a few minutes; fit for CI).
        #[arg(long)]
        quick: bool,
        /// Where checkpoints and the report go.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Only the default pair on 20 held-out prompts × 128 tokens (speedup, τ, identity).
        #[arg(long)]
        default: bool,
        /// Only the servers under load: dspark-serve (plain, speculative with full blocks and
        /// with the schedule, f32 and bf16) and mlx-lm's server on the default pair, 1/4/16/32
        /// concurrent streamed clients, greedy and T = 1; writes serve.json and serve.png.
        #[arg(long)]
        serve: bool,
        /// Only the draft-length schedules on the default pair: the throughput schedule against
        /// full blocks and every static γ, greedy and T = 1 (20 held-out prompts × 128 tokens).
        #[arg(long)]
        schedules: bool,
        /// With --schedules: run every setting this many times over (interleaved), and print
        /// the throughput schedule's ratio to the best static γ per pass. With --steps: passes
        /// over every case (at least 3; the fastest is reported).
        #[arg(long, default_value_t = 1)]
        passes: usize,
        /// Only the CPU fast path's cost targets on the mid-size checkpoint in f32: v(k), the
        /// drafter's round by context length, prefill of 4,096 tokens with and without a drafter.
        #[arg(long)]
        costs: bool,
        /// Only the cost of a plain decode step (graph building and evaluation) on the default
        /// model and the mid-size checkpoint as bf16, 8-bit and 4-bit; writes steps.json.
        #[arg(long)]
        steps: bool,
        /// Only break a speculative round on this pair down into its parts: MODEL,DRAFTER.
        #[arg(long, value_delimiter = ',')]
        round: Option<Vec<PathBuf>>,
        /// Only against llama.cpp (and mlx-lm) on the CPU: llama-bench pp512/tg128 of GGUF
        /// conversions (f32, q8_0, q4_0) of the default and the mid-size checkpoint beside
        /// dspark (f32, 8-bit, 4-bit; plain and speculative) and llama-lookup; writes
        /// peers.json and peers.png. Never in CI: builds llama.cpp once (~45 min) unless
        /// LLAMA_CPP_DIR names a build. --passes sets the interleaved passes (at least 3).
        #[arg(long)]
        peers: bool,
        /// Where models run: cpu, or gpu (an MLX build with CUDA or Metal).
        #[arg(long, default_value = "cpu")]
        device: Device,
    },
    /// Rebuild the embedded default (tokenizer, target, drafter) from the Python standard
    /// library and install it in engine/default/ (about an hour on 2 cores).
    TrainDefault {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Tiny stages, installed under the work directory: a smoke test of the pipeline.
        #[arg(long)]
        quick: bool,
        /// Work directory (default target/train-default).
        #[arg(long)]
        work: Option<PathBuf>,
        /// Start at this stage (target, regen, drafter or calibrate), reusing the earlier stages' outputs
        /// in the work directory.
        #[arg(long, default_value = "target")]
        from: String,
    },
    /// Speculative-decoding losslessness gates: greedy parity and distribution equality.
    Gates {
        /// Tokens per greedy-parity run.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
        /// Speculative samples per distribution-equality condition.
        #[arg(long, default_value_t = 20_000)]
        samples: usize,
        /// Run only this gate (greedy-parity, quantized-drafters, distribution-equality or serve),
        /// or only distribution-equality's default-pair condition (distribution-default-pair).
        #[arg(long)]
        only: Option<String>,
        /// Where checkpoints go.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Where models run: cpu, or gpu (an MLX build with CUDA or Metal).
        #[arg(long, default_value = "cpu")]
        device: Device,
    },
}

/// Makes `device` MLX's default, so every model, cache and drafter of the run lives there.
fn use_device(device: Device) -> Result<()> {
    if !device.is_available() {
        anyhow::bail!("--device {device:?}: the MLX linked here ({}) has no such backend", mlx_core::MLX_DIR);
    }
    device.set_default()?;
    Ok(())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn main() -> Result<()> {
    let cmd = Cli::parse().cmd;
    if let Cmd::Bench { device, .. } | Cmd::Gates { device, .. } = &cmd {
        use_device(*device)?;
    }
    match cmd {
        // Timings mean nothing in a debug build of the workspace crates: rerun optimized.
        Cmd::Bench { .. } if cfg!(debug_assertions) => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["run", "--quiet", "--release", "--package", "xtask", "--"])
                .args(std::env::args_os().skip(1))
                .status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Cmd::Bench { round: Some(pair), .. } => {
            let r = bench::round_breakdown(&pair[0], &pair[1], 64, 20)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
        Cmd::Bench { schedules: true, dir, passes, .. } => {
            let r = bench::schedules(20, 128, passes)?;
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("schedules.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("schedules.json").display());
            Ok(())
        }
        Cmd::Bench { steps: true, dir, passes, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            let r = steps::run(&dir, passes.max(3))?;
            std::fs::write(dir.join("steps.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("steps.json").display());
            Ok(())
        }
        Cmd::Bench { peers: true, dir, passes, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            let r = peers::run(&dir, &target_dir(), passes.max(3))?;
            std::fs::write(dir.join("peers.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("peers.json").display());
            Ok(())
        }
        Cmd::Bench { costs: true, dir, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            let r = bench::costs(&dir, 5)?;
            std::fs::write(dir.join("costs.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("costs.json").display());
            Ok(())
        }
        Cmd::Bench { serve: true, dir, quick, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            std::fs::create_dir_all(&dir)?;
            let r = serve_bench::run(&dir, &target_dir().join("reference-venv"), quick)?;
            std::fs::write(dir.join("serve.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("serve.json").display());
            Ok(())
        }
        Cmd::Bench { default: true, dir, .. } => {
            let r = bench::default_pair(20, 128, 1)?;
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("default_pair.json"), serde_json::to_string_pretty(&r)?)?;
            println!("wrote {}", dir.join("default_pair.json").display());
            Ok(())
        }
        Cmd::Bench { quick, dir, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("bench"));
            bench::run(&dir, &target_dir().join("reference-venv"), quick)
        }
        Cmd::TrainDefault { seed, quick, work, from } => {
            let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
            let work =
                work.unwrap_or_else(|| target_dir().join(if quick { "train-default-quick" } else { "train-default" }));
            let dest = if quick { work.join("installed") } else { train_default::default_dest(&workspace) };
            train_default::run(&workspace, &work, &dest, &train_default::Recipe::new(seed, quick), &from)
        }
        Cmd::Parity { tokens, dir, venv } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("parity"));
            let venv = venv.unwrap_or_else(|| target_dir().join("reference-venv"));
            parity::run(&dir, &venv, tokens)
        }
        Cmd::Gates { tokens, samples, only, dir, .. } => {
            let dir = dir.unwrap_or_else(|| target_dir().join("gates"));
            std::fs::create_dir_all(&dir)?;
            let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
            const GATES: [&str; 5] =
                ["greedy-parity", "quantized-drafters", "distribution-equality", "distribution-default-pair", "serve"];
            if let Some(o) = only.as_deref().filter(|o| !GATES.contains(o)) {
                anyhow::bail!("--only {o:?}: expected one of {}", GATES.join(", "));
            }
            if only.as_deref() == Some("distribution-default-pair") {
                let failures = gates::default_pair_distribution(samples)?;
                anyhow::ensure!(failures.is_empty(), "distribution-equality FAILED for: {}", failures.join(", "));
                println!("\ndistribution-equality on the default pair passed");
            }
            if run("greedy-parity") {
                gates::greedy_parity(&dir, tokens)?;
            }
            if run("quantized-drafters") {
                gates::quantized_drafters(&dir, tokens)?;
            }
            if run("distribution-equality") {
                gates::distribution_equality(&dir, samples)?;
            }
            if run("serve") {
                let root = dir.join("serve");
                std::fs::create_dir_all(&root)?;
                serve_gate::serve_gate(&root, &target_dir().join("serve-venv"))?;
            }
            Ok(())
        }
    }
}
