//! Shared fixtures: scratch directories, tiny DeepSpec / DSpark sources sized for gemma4's tiny
//! config A, and readers for what the quantizer wrote.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use drafter_quant::{Progress, QuantReport, QuantizeOptions, Smoke};
use gemma4::config::tiny_config_a;
use mlx_core::Array;
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::testing::{write_synthetic_deepspec, SyntheticDeepSpec};

pub use gemma4::testing::Scratch;

/// The synthetic DeepSpec for tiny config A, with a Markov rank every group size divides.
pub fn deepspec_opts() -> SyntheticDeepSpec {
    SyntheticDeepSpec { markov_rank: 64, ..SyntheticDeepSpec::default() }
}

pub fn write_deepspec(dir: &Path, opts: &SyntheticDeepSpec) -> PathBuf {
    write_synthetic_deepspec(dir, &tiny_config_a(), opts).expect("synthetic deepspec")
}

/// A DSpark config for tiny config A (taps 1, 3 and the post-norm sentinel 6).
pub fn dspark_config(d_draft: usize) -> DSparkConfig {
    DSparkConfig { d_draft, markov_rank: 64, ..DSparkConfig::with_taps(vec![1, 3, 6]) }
}

pub fn write_dspark(dir: &Path, cfg: DSparkConfig) -> PathBuf {
    DSparkDrafter::init(cfg, &tiny_config_a(), "tiny", 7, true)
        .expect("init dspark")
        .save(dir, false)
        .expect("save dspark")
}

pub fn opts(bits: u32, group_size: u32, smoke: Smoke) -> QuantizeOptions {
    QuantizeOptions { bits, group_size, smoke, ..Default::default() }
}

/// Runs the quantizer, collecting progress events.
pub fn run(src: &Path, dst: &Path, o: &QuantizeOptions) -> (drafter_quant::Result<QuantReport>, Vec<Progress>) {
    let mut events = Vec::new();
    let r = drafter_quant::quantize_drafter(src, dst, o, &mut |p| events.push(p.clone()));
    (r, events)
}

/// Every tensor of a checkpoint directory.
pub fn tensors(dir: &Path) -> BTreeMap<String, Array> {
    gemma4::weights::load_raw(dir).expect("load tensors")
}

pub fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read json")).expect("parse json")
}
