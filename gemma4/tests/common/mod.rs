//! Shared fixtures of the gemma4 test binaries: one scratch root per process, scratch
//! directories removed after use, and tiny random checkpoints written once per binary.
//!
//! Everything lives under `$CARGO_TARGET_TMPDIR/gemma4-tests-PID`; roots of earlier runs whose
//! process is gone are removed when a binary first asks for its root.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::{tiny_config_a, tiny_config_b, tiny_config_moe_top8};
use mlx_core::Dtype;

#[allow(unused_imports)] // not every test binary uses every fixture
pub use gemma4::testing::{scratch_root as root, Scratch};

/// A path under the root for something kept until the process ends (cached checkpoints).
pub fn scratch(name: &str) -> PathBuf {
    gemma4::testing::scratch(name)
}

/// A fresh copy of the flat directory `src` at scratch `name`.
pub fn copy_of(src: &Path, name: &str) -> Scratch {
    gemma4::testing::copy_of(src, name).unwrap()
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
