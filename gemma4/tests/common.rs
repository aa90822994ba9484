//! Shared fixtures: tiny random checkpoints written once per test binary into the target dir.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::{tiny_config_a, tiny_config_b};
use mlx_core::Dtype;

pub fn scratch(name: &str) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    base.join(format!("{name}-{}", std::process::id()))
}

pub fn tiny_a() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&scratch("tiny-a"), &tiny_config_a(), 1234, Dtype::Bf16, 2, true).unwrap()
    })
}

pub fn tiny_b_f32() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&scratch("tiny-b"), &tiny_config_b(), 1234, Dtype::F32, 1, true).unwrap()
    })
}
