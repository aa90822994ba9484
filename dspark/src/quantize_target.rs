//! `dspark quantize-target`: an MLX-affine quantized copy of a Gemma-4 target checkpoint, laid
//! out as `mlx_lm.convert -q` writes it (the library is `gemma4::checkpoint::quantize_checkpoint`).

use std::path::PathBuf;

use drafter_quant::human_bytes;

/// Arguments of `dspark quantize-target`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    // A bf16 or f32 Gemma-4 checkpoint.
    #[command(flatten)]
    pub model: engine::args::ModelDirArg,
    /// Output directory [default: MODEL-qBITS-gGROUP_SIZE].
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Bits per weight (MLX affine: 2, 3, 4, 5, 6 or 8).
    #[arg(long, default_value_t = 4, allow_negative_numbers = true)]
    pub bits: u32,
    /// Weights per scale/bias group: 32, 64 or 128.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub group_size: u32,
    /// Replace a non-empty output directory.
    #[arg(long)]
    pub force: bool,
}

/// Runs the subcommand. The output may not be, contain or lie inside the source checkpoint.
pub fn run(args: Args) -> anyhow::Result<()> {
    crate::paths::refuse_drafter_as_model(&args.model.model, "--model")?;
    let out = args.out.clone().unwrap_or_else(|| {
        // Beside the model (resolved first, so `--model .` does not put it inside).
        let model = std::fs::canonicalize(&args.model.model).unwrap_or_else(|_| args.model.model.clone());
        let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into());
        model.with_file_name(format!("{name}-q{}-g{}", args.bits, args.group_size))
    });
    crate::paths::check_out_dir(&args.model.model, &out)?;
    eprintln!("quantizing {} to {} bits, group {} ...", args.model.model.display(), args.bits, args.group_size);
    let dir = gemma4::checkpoint::quantize_checkpoint(&args.model.model, &out, args.bits, args.group_size, args.force)?;
    let size = |d: &std::path::Path| -> u64 {
        std::fs::read_dir(d)
            .map(|it| it.flatten().filter_map(|e| e.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
            .unwrap_or(0)
    };
    println!("wrote {} ({} -> {})", dir.display(), human_bytes(size(&args.model.model)), human_bytes(size(&dir)));
    Ok(())
}
