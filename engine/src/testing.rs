//! Fixtures for the tests of this crate and its front ends (feature `testing`): a tiny random
//! target with a tokenizer, and a DSpark drafter fitted to it by counting (so drafts are
//! sometimes accepted), each written once per test binary.

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::Model;
use mlx_core::Dtype;

/// The target checkpoint's directory.
pub fn target_dir() -> &'static PathBuf {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let dir = gemma4::testing::scratch("engine-target");
        write_random_checkpoint(&dir, &tiny_config_a(), 7, Dtype::Bf16, 1, true).expect("target checkpoint")
    })
}

/// The fitted drafter's directory.
pub fn drafter_dir() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let m = Model::load(target_dir()).expect("target");
        let prompts: Vec<Vec<u32>> = (0..4u32).map(|i| (0..5).map(|j| 4 + (i * 37 + j * 11) % 500).collect()).collect();
        let d = spec_decode::dspark::fit_bigram_drafter(&m, "engine-test", &prompts, 48, 4).expect("fit");
        d.save(&gemma4::testing::scratch("engine-drafter"), true).expect("save drafter")
    })
}
