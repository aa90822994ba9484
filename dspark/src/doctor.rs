//! `dspark doctor`: what this build runs on — MLX, devices, the BLAS behind f32 matmuls and
//! whether it is in effect, memory, and what `--dtype auto` would choose for a model.

use anyhow::{Context, Result};
use gemma4::ComputeDtype;
use mlx_core::blas;
use mlx_core::Device;

/// Arguments of `dspark doctor`.
#[derive(clap::Args)]
pub struct Args {
    // The report also says what `--dtype auto` picks for this checkpoint.
    #[command(flatten)]
    target: engine::args::TargetArg,
}

/// Prints the report; fails only when nothing can run (no CPU backend).
pub fn run(a: Args) -> Result<()> {
    println!("MLX {} at {}", mlx_core::mlx_version(), mlx_core::MLX_DIR);
    println!(
        "devices: cpu {} | gpu {}",
        yes_no(Device::Cpu.is_available()),
        if Device::Gpu.is_available() { "yes (Metal or CUDA)" } else { "no (this MLX build is CPU-only)" }
    );
    let check = blas::sgemm_check(1024, 5).context("timing an f32 matmul on the CPU")?;
    let linked = blas::linked().unwrap_or("none found at build time (MLX's bundled reference BLAS)");
    match blas::openblas_core() {
        Some(core) => println!("BLAS: {linked} (OpenBLAS kernels: {core})"),
        None => println!("BLAS: {linked}"),
    }
    if let Some(why) = blas::openblas_fallback() {
        println!("warning: {why}");
    }
    println!(
        "f32 matmul 1024²: {:.1} GFLOP/s — {}",
        check.gflops,
        if check.is_fast() {
            "an optimized BLAS is in effect"
        } else {
            "SLOW: the reference BLAS serves f32 matmuls; install libopenblas-dev (Debian/Ubuntu) or \
             openblas-devel (Fedora) and rebuild, or set MLX_CORE_BLAS to a libopenblas/libblis .so"
        }
    );
    println!(
        "BLAS rows batch-invariant: {} ; decode/verify products use the row-invariant kernel: {}",
        match blas::row_quantum_probe() {
            Some(1) => "yes".to_string(),
            Some(q) => format!("no (only in multiples of {q} rows)"),
            None => "no (a row's bits depend on its batch)".to_string(),
        },
        yes_no(blas::row_linear_enabled())
    );
    if let Ok(threads) = std::env::var("OPENBLAS_NUM_THREADS") {
        println!("OPENBLAS_NUM_THREADS={threads}");
    }
    println!("CPU threads: {}", std::thread::available_parallelism().map_or(0, |n| n.get()));
    let dir = match a.target.model {
        Some(d) => d,
        None => crate::default_model::ensure(false)?,
    };
    let cfg = gemma4::TextConfig::from_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
    let wm = gemma4::weights::WeightMap::load(&dir, &cfg).with_context(|| format!("reading {}", dir.display()))?;
    let resolved = ComputeDtype::Auto.resolve(wm.f32_bytes(), wm.has_quantized(), Device::Cpu);
    println!(
        "model {}: --dtype auto on cpu computes in {} (f32 copy {:.2} GB, memory available {})",
        dir.display(),
        resolved.describe(),
        resolved.f32_bytes as f64 / 1e9,
        resolved.available_bytes.map_or("unknown".to_string(), |b| format!("{:.1} GB", b as f64 / 1e9))
    );
    Ok(())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
