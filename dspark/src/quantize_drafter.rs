//! `dspark quantize-drafter`: an MLX-affine quantized copy of a DeepSpec or DSpark drafter
//! checkpoint (the library is `drafter_quant::quantize_drafter`).

use std::path::PathBuf;

use drafter_quant::{human_bytes, quantize_drafter, Progress, QuantizeOptions, Smoke, SmokeOutcome};

/// Arguments of `dspark quantize-drafter`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The unquantized drafter checkpoint (DeepSpec config.json, bf16; or DSpark dspark.json,
    /// f32 like the embedded default).
    #[arg(long, value_name = "DIR")]
    pub src: PathBuf,
    /// Output directory [default: SRC-affine-qBITS-gGROUP_SIZE].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Bits per weight: 4 or 8.
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    pub bits: u32,
    /// Weights per scale/bias group: 32, 64 or 128. A matrix it does not divide gets the largest
    /// smaller size that does (or stays unquantized), and the run names it.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub group_size: u32,
    /// Replace a non-empty output directory.
    #[arg(long)]
    pub force: bool,
    /// Skip the load smoke (reload + one draft round).
    #[arg(long, conflicts_with = "smoke_target")]
    pub no_smoke: bool,
    /// The drafter's target model, for the load smoke's draft round (without it a drafter for
    /// another target is only reloaded and fed one context row).
    #[arg(long, value_name = "DIR")]
    pub smoke_target: Option<PathBuf>,
}

/// Runs the subcommand: per-tensor progress on stderr, a summary on stdout. The output may not
/// be, contain or lie inside the source checkpoint.
pub fn run(args: Args) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| drafter_quant::default_out_dir(&args.src, args.bits, args.group_size));
    crate::paths::check_out_dir(&args.src, &out)?;
    let smoke = match (&args.smoke_target, args.no_smoke) {
        (_, true) => Smoke::Off,
        (Some(t), false) => Smoke::Target(t.clone()),
        (None, false) => Smoke::Auto,
    };
    let opts = QuantizeOptions {
        bits: args.bits,
        group_size: args.group_size,
        force: args.force,
        smoke,
        ..Default::default()
    };
    let mut print = |p: &Progress| match p {
        Progress::Start { kind, tensors, src_bytes } => {
            eprintln!(
                "{kind:?} drafter, {tensors} tensors, {} — quantizing to {} bits, group {}",
                human_bytes(*src_bytes),
                opts.bits,
                opts.group_size
            )
        }
        Progress::Tensor { index, total, name, shape, dtype, quantized, src_bytes, dst_bytes } => {
            let what = if *quantized { "quantized" } else { "kept     " };
            eprintln!(
                "[{index:>4}/{total}] {what} {name} {shape:?} {dtype}: {} -> {}",
                human_bytes(*src_bytes),
                human_bytes(*dst_bytes)
            );
        }
        Progress::Warning(w) => eprintln!("warning: {w}"),
        Progress::Smoke(SmokeOutcome::Passed { target, drafts, vocab }) => {
            eprintln!("load smoke: PASS (one round on {target}: {drafts} drafts, logits [{drafts}, {vocab}])")
        }
        Progress::Smoke(SmokeOutcome::Skipped { .. } | SmokeOutcome::ContextOnly { .. }) => {}
    };
    let r = quantize_drafter(&args.src, &out, &opts, &mut print).map_err(|e| match e {
        drafter_quant::Error::OutputNotEmpty { .. } => anyhow::Error::new(e).context("pass --force to replace it"),
        e => e.into(),
    })?;
    println!("wrote {}", r.out_dir.display());
    println!(
        "{:?}: {} tensors quantized, {} kept; {} -> {} in {} shard(s); {:.2} bits per quantized weight",
        r.kind,
        r.tensors_quantized,
        r.tensors_kept,
        human_bytes(r.src_bytes),
        human_bytes(r.dst_bytes),
        r.shards,
        r.bits_per_weight
    );
    match &r.smoke {
        SmokeOutcome::Skipped { reason } => println!("load smoke: skipped — {reason}"),
        SmokeOutcome::ContextOnly { reason } => println!("load smoke: partial — {reason}"),
        SmokeOutcome::Passed { .. } => {}
    }
    println!("next: compare acceptance against the bf16 drafter on the same prompts (drafter numerics move acceptance, never output)");
    Ok(())
}
