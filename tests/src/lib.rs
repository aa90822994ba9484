//! Shared fixtures for the cross-crate tests in `tests/tests/`.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::TextConfig;
use mlx_core::Dtype;

pub use gemma4::testing::scratch;

/// Writes (once per path) a random-weight target checkpoint.
pub fn target_checkpoint(dir: &Path, cfg: &TextConfig, seed: u64) -> PathBuf {
    if dir.join("config.json").is_file() {
        return dir.to_path_buf();
    }
    write_random_checkpoint(dir, cfg, seed, Dtype::Bf16, 1, true).expect("writing a tiny checkpoint")
}

/// `n` prompt ids spread over a vocabulary of `vocab` (ids ≥ 4 are ordinary tokens).
pub fn prompt(n: usize, vocab: u32, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11 + salt * 101) % (vocab - 4)).collect()
}
