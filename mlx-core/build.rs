//! Finds MLX, compiles the C++ bridge against its headers and links its `libmlx`.
//!
//! Search order (see README.md): `MLX_DIR` (a directory with `include/` and `lib/`), then the
//! `mlx` package of `python3` if it is the pinned version, then the pinned `mlx-cpu` wheel
//! provisioned with pip into `<target>/mlx-dist`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLX release whose numerics the project is pinned to (gemma4 parity is checked against it).
const MLX_VERSION: &str = "0.32.4";

fn env_var_rerun(name: &str) -> Option<String> {
    println!("cargo:rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    if let Err(msg) = run() {
        eprintln!("\nerror: mlx-core could not find or provision MLX.\n{msg}\n");
        eprintln!(
            "Set MLX_DIR to a directory holding MLX {MLX_VERSION}'s include/ and lib/ (for example the \
             `mlx` folder of an installed `mlx-cpu`, `mlx-cuda-12` or `mlx-metal` wheel: \
             `python3 -m pip install --target DIR mlx-cpu=={MLX_VERSION}` then MLX_DIR=DIR/mlx)."
        );
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-changed=src/sys/shim.h");
    println!("cargo:rerun-if-changed=src/sys/shim.cc");
    println!("cargo:rerun-if-changed=src/sys/row_linear.cc");
    println!("cargo:rerun-if-changed=src/sys/row_attention.cc");
    println!("cargo:rerun-if-changed=src/sys/row_gelu.cc");
    println!("cargo:rerun-if-changed=src/sys/row_sample.cc");
    println!("cargo:rerun-if-changed=src/sys/row_confidence.cc");
    println!("cargo:rerun-if-changed=src/sys/row_layer.cc");
    println!("cargo:rerun-if-changed=src/sys/row_markov.cc");
    println!("cargo:rerun-if-changed=src/sys/row_quantized.cc");
    println!("cargo:rerun-if-changed=src/sys/row_nibble_dot.cc");
    println!("cargo:rerun-if-changed=src/sys/row_compute.h");
    println!("cargo:rerun-if-changed=src/sys/row_kernel.h");
    println!("cargo:rerun-if-changed=src/sys/row_split.h");
    println!("cargo:rerun-if-changed=src/sys/row_packed.h");
    println!("cargo:rerun-if-changed=src/sys/mod.rs");
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let out_dir = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);

    let mlx = locate_mlx(&out_dir, &target_os)?;
    let include = mlx.join("include");
    let lib = mlx.join("lib");
    let version = read_version(&include)?;
    if version != MLX_VERSION {
        println!(
            "cargo:warning=MLX at {} is version {version}, the project is pinned to {MLX_VERSION}; \
             bit parity with the reference is only checked for {MLX_VERSION}",
            mlx.display()
        );
    }

    let blas = if target_os == "linux" { locate_blas() } else { None };
    let mut build = cxx_build::bridge("src/sys/mod.rs");
    if blas.is_some() {
        build.define("MLX_CORE_BLAS_ANCHOR", None);
    }
    build
        .file("src/sys/shim.cc")
        .file("src/sys/row_linear.cc")
        .file("src/sys/row_attention.cc")
        .file("src/sys/row_gelu.cc")
        .file("src/sys/row_sample.cc")
        .file("src/sys/row_confidence.cc")
        .file("src/sys/row_layer.cc")
        .file("src/sys/row_markov.cc")
        .file("src/sys/row_quantized.cc")
        .file("src/sys/row_nibble_dot.cc")
        // The row-invariant kernels are hot code: optimise it even in dev builds.
        .opt_level(3)
        .include(&include)
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations");
    if target_os == "macos" {
        build.flag("-mmacosx-version-min=13.3");
    }
    build.compile("mlx_core_bridge");

    // The optimized BLAS goes first: MLX leaves `cblas_*` undefined and the process's first
    // library that defines them wins (see README.md, "CPU speed").
    match &blas {
        Some(path) => {
            let (dir, name) = split_lib(path)?;
            println!("cargo:rustc-link-search=native={}", dir.display());
            // shim.cc references `cblas_sgemm` under MLX_CORE_BLAS_ANCHOR, so --as-needed keeps it.
            println!("cargo:rustc-link-lib=dylib:+verbatim={name}");
            println!("cargo:rustc-env=MLX_CORE_BLAS={}", path.display());
        }
        None => {
            if target_os == "linux" {
                println!(
                    "cargo:warning=no optimized BLAS found (install libopenblas-dev, or set MLX_CORE_BLAS to a \
                     libopenblas/libblis .so); f32 matmuls will use MLX's bundled reference BLAS (~40x slower)"
                );
            }
            println!("cargo:rustc-env=MLX_CORE_BLAS=");
        }
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // Make libmlx (and, for the CPU wheel, its bundled BLAS/LAPACK) visible next to the test
    // binaries and executables; .cargo/config.toml points their run-path there.
    expose_libraries(&mlx, blas.as_deref(), &out_dir)?;
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:rustc-env=MLX_CORE_MLX_DIR={}", mlx.display());
    println!("cargo:rustc-env=MLX_CORE_MLX_VERSION={version}");
    println!("cargo:libdir={}", lib.display());
    Ok(())
}

/// An optimized CBLAS for MLX's f32 matmuls: `MLX_CORE_BLAS` (a library path, or `none`), then
/// pkg-config's `openblas`, then the usual Debian/Fedora/Arch locations of OpenBLAS and BLIS.
fn locate_blas() -> Option<PathBuf> {
    if let Some(v) = env_var_rerun("MLX_CORE_BLAS") {
        if v == "none" {
            return None;
        }
        let p = PathBuf::from(&v);
        if p.is_file() {
            return Some(p);
        }
        println!("cargo:warning=MLX_CORE_BLAS={v} is not a file; looking for OpenBLAS elsewhere");
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pkg-config").args(["--variable=libdir", "openblas"]).output() {
        if out.status.success() {
            let d = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !d.is_empty() {
                dirs.push(PathBuf::from(d));
            }
        }
    }
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/lib/{arch}-linux-gnu");
    for d in [multiarch.clone(), format!("{multiarch}/openblas-pthread"), "/usr/lib64".into(), "/usr/lib".into()] {
        dirs.push(PathBuf::from(d));
    }
    let names = ["libopenblas.so.0", "libopenblas.so", "libblis.so.4", "libblis.so"];
    names.iter().flat_map(|n| dirs.iter().map(move |d| d.join(n))).find(|p| p.is_file())
}

/// `dir/libfoo.so.0` -> (dir, "libfoo.so.0").
fn split_lib(path: &Path) -> Result<(PathBuf, String), String> {
    let dir = path.parent().ok_or_else(|| format!("{} has no parent directory", path.display()))?;
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| format!("bad file name {}", path.display()))?;
    Ok((dir.to_path_buf(), name.to_string()))
}

fn locate_mlx(out_dir: &Path, target_os: &str) -> Result<PathBuf, String> {
    if let Some(dir) = env_var_rerun("MLX_DIR") {
        let dir = PathBuf::from(dir);
        check_layout(&dir).map_err(|e| format!("MLX_DIR={}: {e}", dir.display()))?;
        return Ok(dir);
    }
    if let Some(dir) = python_mlx() {
        if check_layout(&dir).is_ok() && read_version(&dir.join("include")).ok().as_deref() == Some(MLX_VERSION) {
            return Ok(dir);
        }
        println!(
            "cargo:warning=ignoring python3's mlx at {} (not a complete MLX {MLX_VERSION} with headers)",
            dir.display()
        );
    }
    provision_wheel(out_dir, target_os)
}

fn check_layout(dir: &Path) -> Result<(), String> {
    let header = dir.join("include/mlx/mlx.h");
    if !header.is_file() {
        return Err(format!("expected {} to exist", header.display()));
    }
    let lib = dir.join("lib");
    let found = ["libmlx.so", "libmlx.dylib"].iter().any(|n| lib.join(n).is_file());
    if !found {
        return Err(format!("expected libmlx.so or libmlx.dylib in {}", lib.display()));
    }
    Ok(())
}

fn read_version(include: &Path) -> Result<String, String> {
    let path = include.join("mlx/version.h");
    let text = fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let field = |name: &str| -> Result<String, String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("#define {name} ")).map(|v| v.trim().to_string()))
            .ok_or_else(|| format!("{} has no {name}", path.display()))
    };
    Ok(format!("{}.{}.{}", field("MLX_VERSION_MAJOR")?, field("MLX_VERSION_MINOR")?, field("MLX_VERSION_PATCH")?))
}

fn python() -> String {
    env_var_rerun("PYTHON3").unwrap_or_else(|| "python3".to_string())
}

fn python_mlx() -> Option<PathBuf> {
    let out = Command::new(python())
        .args(["-c", "import mlx, os; print(os.path.dirname(mlx.__file__) if mlx.__file__ else list(mlx.__path__)[0])"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    Some(PathBuf::from(s.trim()))
}

/// The profile directory (`target/debug`), three levels above OUT_DIR.
fn profile_dir(out_dir: &Path) -> Result<PathBuf, String> {
    out_dir
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .ok_or_else(|| format!("unexpected OUT_DIR layout: {}", out_dir.display()))
}

fn provision_wheel(out_dir: &Path, target_os: &str) -> Result<PathBuf, String> {
    let package = match target_os {
        "macos" => format!("mlx-metal=={MLX_VERSION}"),
        _ => format!("mlx-cpu=={MLX_VERSION}"),
    };
    // Shared by every profile and kept across rebuilds of this crate: <target>/mlx-dist.
    let target_dir = match env_var_rerun("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => profile_dir(out_dir)?
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| "cannot find the target directory".to_string())?,
    };
    let dist = target_dir.join("mlx-dist");
    let mlx = dist.join("mlx");
    let stamp = dist.join(format!(".installed-{package}"));
    if stamp.is_file() && check_layout(&mlx).is_ok() {
        return Ok(mlx);
    }
    println!("cargo:warning=provisioning {package} into {} with pip", dist.display());
    eprintln!("mlx-core: running `{} -m pip install --target {} {package}`", python(), dist.display());
    let status = Command::new(python())
        .args(["-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target"])
        // A --target install touches no environment; some distro pips still refuse it (PEP 668).
        .env("PIP_BREAK_SYSTEM_PACKAGES", "1")
        .arg(&dist)
        .arg(&package)
        .status()
        .map_err(|e| format!("could not run {} -m pip: {e}", python()))?;
    if !status.success() {
        return Err(format!("`{} -m pip install --target {} {package}` failed ({status})", python(), dist.display()));
    }
    check_layout(&mlx).map_err(|e| format!("after installing {package}: {e}"))?;
    fs::write(&stamp, b"ok").map_err(|e| format!("writing {}: {e}", stamp.display()))?;
    Ok(mlx)
}

/// Symlinks libmlx and the wheel's bundled libraries into `<profile>/deps`.
fn expose_libraries(mlx: &Path, blas: Option<&Path>, out_dir: &Path) -> Result<(), String> {
    let deps = profile_dir(out_dir)?.join("deps");
    fs::create_dir_all(&deps).map_err(|e| format!("creating {}: {e}", deps.display()))?;
    let mut libs: Vec<PathBuf> = Vec::new();
    for dir in [mlx.join("lib"), mlx.with_file_name("mlx_cpu.libs")] {
        if let Ok(entries) = fs::read_dir(&dir) {
            for e in entries.flatten() {
                let p = e.path();
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                if name.starts_with("lib") && (name.contains(".so") || name.ends_with(".dylib")) {
                    libs.push(p);
                }
            }
        }
    }
    // The BLAS too, in case its folder is not on the loader's default path.
    libs.extend(blas.map(Path::to_path_buf));
    for lib in libs {
        let Some(name) = lib.file_name() else { continue };
        let link = deps.join(name);
        let _ = fs::remove_file(&link);
        symlink(&lib, &link).map_err(|e| format!("linking {} -> {}: {e}", link.display(), lib.display()))?;
    }
    Ok(())
}

#[cfg(unix)]
fn symlink(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(src, dst)
}

#[cfg(not(unix))]
fn symlink(src: &Path, dst: &Path) -> std::io::Result<()> {
    fs::copy(src, dst).map(|_| ())
}
