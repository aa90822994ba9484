//! `dspark`: generate with a Gemma-4 target on MLX.
#![forbid(unsafe_code)]

use anyhow::Result;
use clap::{Parser, Subcommand};
use dspark::{
    calibrate, default_model, doctor, eval_drafter, generate, profile, quantize_drafter, quantize_target, regen, serve,
    train, train_target,
};

#[derive(Parser)]
#[command(name = "dspark", version, about = "Gemma-4 on MLX with lossless speculative decoding")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text (or token ids) from a prompt.
    Generate(generate::Args),
    /// Fit confidence-pruning thresholds for a DSpark drafter and store them in its checkpoint.
    Calibrate(calibrate::Args),
    /// Write an MLX-affine-quantized copy of a drafter checkpoint (DSpark or DeepSpec).
    QuantizeDrafter(quantize_drafter::Args),
    /// Write an MLX-affine-quantized copy of a Gemma-4 target checkpoint (mlx-lm's layout).
    QuantizeTarget(quantize_target::Args),
    /// Regenerate drafter training data: the target answers prompts (or reads documents) and its
    /// tapped hidden rows are written as shards (resumable).
    Regen(regen::Args),
    /// Train a small Gemma-4 target from scratch on Python's standard library (with its BPE).
    TrainTarget(train_target::Args),
    /// Train a DSpark drafter for a target on shards written by `dspark regen`.
    Train(train::Args),
    /// Live τ (greedy and sampled) next to analytic τ for a DSpark drafter on held-out prompts.
    EvalDrafter(eval_drafter::Args),
    /// Report MLX, devices, the BLAS behind f32 matmuls (timed) and what --dtype auto picks.
    Doctor(doctor::Args),
    /// Measure the target's verify cost v(n) on this device and dtype, for `--schedule`.
    Profile(profile::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (/v1/completions,
    /// /v1/chat/completions), decoding speculatively with --drafter: runs the dspark-serve
    /// binary next to this one with the same arguments.
    #[command(disable_help_flag = true)]
    Serve(serve::Args),
    /// Write (or rewrite) the embedded default checkpoint and print its path.
    InitDefault {
        /// Replace an existing default checkpoint.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Generate(args) => generate::run(args),
        Cmd::QuantizeDrafter(args) => quantize_drafter::run(args),
        Cmd::QuantizeTarget(args) => quantize_target::run(args),
        Cmd::Calibrate(args) => calibrate::run(args),
        Cmd::Regen(args) => regen::run(args),
        Cmd::Train(args) => train::run(args),
        Cmd::TrainTarget(args) => train_target::run(args),
        Cmd::EvalDrafter(args) => eval_drafter::run(args),
        Cmd::Doctor(args) => doctor::run(args),
        Cmd::Profile(args) => profile::run(args),
        Cmd::Serve(args) => serve::run(args),
        Cmd::InitDefault { force } => {
            let dir = default_model::ensure(force)?;
            let drafter = default_model::ensure_drafter(force)?;
            println!("{}", dir.display());
            println!("{}", drafter.display());
            Ok(())
        }
    }
}
