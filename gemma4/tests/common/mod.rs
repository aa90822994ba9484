//! Shared fixtures of the gemma4 test binaries: one scratch root per process, scratch
//! directories removed after use, and tiny random checkpoints written once per binary.
//!
//! Everything lives under `$CARGO_TARGET_TMPDIR/gemma4-tests-PID`; roots of earlier runs whose
//! process is gone are removed when a binary first asks for its root.

#![allow(dead_code)]

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::{tiny_config_a, tiny_config_b, tiny_config_moe_top8};
use mlx_core::Dtype;

const ROOT_PREFIX: &str = "gemma4-tests-";

/// This process's scratch root.
pub fn root() -> &'static PathBuf {
    static ROOT: OnceLock<PathBuf> = OnceLock::new();
    ROOT.get_or_init(|| {
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let me = std::process::id();
        if Path::new("/proc/self").exists() {
            for e in std::fs::read_dir(&base).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let pid = name.strip_prefix(ROOT_PREFIX).and_then(|p| p.parse::<u32>().ok());
                if pid.is_some_and(|p| p != me && !Path::new(&format!("/proc/{p}")).exists()) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let r = base.join(format!("{ROOT_PREFIX}{me}"));
        std::fs::create_dir_all(&r).unwrap();
        r
    })
}

/// A path under the root for something kept until the process ends (cached checkpoints).
pub fn scratch(name: &str) -> PathBuf {
    root().join(name)
}

/// A scratch directory (not created) that is removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let p = root().join(name);
        if p.exists() {
            std::fs::remove_dir_all(&p).unwrap();
        }
        Scratch(p)
    }
}

impl Deref for Scratch {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh copy of the flat directory `src` at scratch `name`.
pub fn copy_of(src: &Path, name: &str) -> Scratch {
    let dst = Scratch::new(name);
    std::fs::create_dir_all(&*dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    dst
}

/// Config A, bf16, two shards.
pub fn tiny_a() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&scratch("tiny-a"), &tiny_config_a(), 1234, Dtype::Bf16, 2, true).unwrap()
    })
}

/// Config B (MoE, top-2 of 4 experts), f32.
pub fn tiny_b_f32() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&scratch("tiny-b"), &tiny_config_b(), 1234, Dtype::F32, 1, true).unwrap()
    })
}

/// The MoE top-8 config, f32 (MLX's CPU gather_mm is f32-only).
pub fn tiny_moe_top8() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&scratch("tiny-moe-top8"), &tiny_config_moe_top8(), 1234, Dtype::F32, 1, true).unwrap()
    })
}
