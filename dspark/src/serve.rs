//! `dspark serve`: runs the HTTP server's own binary, `dspark-serve`, from the directory this
//! binary is in, with the same arguments. The server lives in its own package so that this
//! command line links no async runtime or HTTP stack.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Arguments of `dspark serve`: everything after `serve`, for `dspark-serve`.
#[derive(clap::Args)]
pub struct Args {
    /// `dspark-serve`'s flags (see `dspark serve --help`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Where `dspark-serve` is expected: beside this binary.
pub fn server_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the dspark binary")?;
    Ok(exe.with_file_name(format!("dspark-serve{}", std::env::consts::EXE_SUFFIX)))
}

/// Runs `dspark-serve` with the arguments (on Unix in place of this process, so signals reach
/// the server itself); fails with how to build it when it is missing.
pub fn run(a: Args) -> Result<()> {
    let server = server_binary()?;
    if !server.is_file() {
        bail!(
            "dspark serve runs the server binary dspark-serve, which is not at {}; build it with `cargo build \
             --release -p dspark-serve` (it is placed next to dspark), or run dspark-serve directly",
            server.display()
        );
    }
    let mut cmd = Command::new(&server);
    cmd.args(&a.args);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // exec only returns on failure.
        let e = cmd.exec();
        bail!("running {}: {e}", server.display())
    }
    #[cfg(not(unix))]
    {
        let status = cmd.status().with_context(|| format!("running {}", server.display()))?;
        std::process::exit(status.code().unwrap_or(1))
    }
}
