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

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("drafter-quant-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir)
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }

    /// Names of every entry in the scratch dir (to spot staging leftovers).
    pub fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read scratch")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The synthetic DeepSpec for tiny config A, with a Markov rank every group size divides.
pub fn deepspec_opts() -> SyntheticDeepSpec {
    SyntheticDeepSpec { markov_rank: 64, ..SyntheticDeepSpec::default() }
}

pub fn write_deepspec(dir: &Path, opts: &SyntheticDeepSpec) -> PathBuf {
    write_synthetic_deepspec(dir, &tiny_config_a(), opts).expect("synthetic deepspec")
}

/// A DSpark config for tiny config A (taps 1, 3 and the post-norm sentinel 6).
pub fn dspark_config(d_draft: usize) -> DSparkConfig {
    DSparkConfig {
        gamma: 4,
        d_draft,
        n_layers: 2,
        n_heads: 4,
        markov_rank: 64,
        ff_mult: 2,
        tap_layers: vec![1, 3, 6],
        seq_head: None,
        sts: None,
    }
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
