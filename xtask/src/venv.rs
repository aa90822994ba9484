//! The reference environment: a venv with the pinned mlx-lm and mlx wheels from PyPI. It is a
//! gate dependency only; no crate links or imports it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Pinned reference versions: the parity gate holds gemma4 to mlx-lm 0.32.2 on mlx 0.32.4.
pub const PACKAGES: [&str; 3] = ["mlx==0.32.4", "mlx-cpu==0.32.4", "mlx-lm==0.32.2"];

/// Creates (once) and returns the reference venv's python, or `XTASK_REFERENCE_PYTHON` when
/// set: a python that already imports the pinned mlx and mlx-lm (a machine with no package
/// index, or an MLX build with CUDA).
pub fn ensure(dir: &Path) -> Result<PathBuf> {
    if let Some(python) = std::env::var_os("XTASK_REFERENCE_PYTHON") {
        return Ok(PathBuf::from(python));
    }
    ensure_with(dir, &PACKAGES)
}

/// Creates (once) a venv at `dir` with the pinned `packages` and returns its python.
pub fn ensure_with(dir: &Path, packages: &[&str]) -> Result<PathBuf> {
    let python = dir.join("bin/python");
    let stamp = dir.join(format!(".installed-{}", packages.join("+")));
    if python.is_file() && stamp.is_file() {
        return Ok(python);
    }
    let host = std::env::var("PYTHON3").unwrap_or_else(|_| "python3".into());
    eprintln!("xtask: creating the venv at {} ({})", dir.display(), packages.join(", "));
    run(Command::new(&host).args(["-m", "venv"]).arg(dir)).context("creating the venv")?;
    run(Command::new(&python).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]).args(packages))
        .with_context(|| format!("installing {} into the venv", packages.join(", ")))?;
    std::fs::write(&stamp, b"ok")?;
    Ok(python)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
