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

/// A fixed prompt of `n` tokens.
pub fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37) % 500).collect()
}

/// An array's raw bytes (for bit-for-bit comparisons).
pub fn bytes(a: &mlx_core::Array) -> Vec<u8> {
    a.to_bytes().unwrap()
}

pub fn decode_one_by_one(m: &gemma4::Model, cache: &mut gemma4::Cache, tokens: &[u32]) -> Vec<Vec<u8>> {
    tokens
        .iter()
        .map(|&t| bytes(&m.logits(&gemma4::generate::ids_array(&[t]).unwrap(), Some(cache)).unwrap()))
        .collect()
}

/// Verify-shaped rounds: a stepwise window of S tokens, of which the first `keep` are kept and
/// the rest rolled back. Every stepwise row must equal, bit for bit, the logits of decoding the
/// same tokens one at a time on a cache that only ever saw the kept ones; prompts shorter and
/// longer than the window (8) put the ring phase on both branches, and the rounds run far past
/// the wrap.
pub fn check_stepwise_rounds(m: &gemma4::Model, prompt_len: usize, rounds: &[(usize, usize)]) {
    let p = prompt(prompt_len);
    let (head, last) = p.split_at(prompt_len - 1);
    let mut spec = m.new_cache();
    let mut plain = m.new_cache();
    for c in [&mut spec, &mut plain] {
        for chunk in head.chunks(5) {
            m.forward(&gemma4::generate::ids_array(chunk).unwrap(), Some(c)).unwrap();
        }
    }
    let mut pending = last[0];
    for (r, &(s, keep)) in rounds.iter().enumerate() {
        let window: Vec<u32> =
            std::iter::once(pending).chain((1..s as u32).map(|i| 3 + (pending * 7 + i * 53) % 500)).collect();
        let out = m.forward_stepwise(&gemma4::generate::ids_array(&window).unwrap(), &mut spec, None).unwrap();
        let logits = m.logits_from_hidden(&out.hidden).unwrap(); // [1, S, V]
        let want = decode_one_by_one(m, &mut plain.clone(), &window);
        for (i, w) in want.iter().enumerate() {
            let got = bytes(&logits.slice_axis(1, i as i32, i as i32 + 1).unwrap());
            assert!(&got == w, "prompt {prompt_len}, round {r}, row {i} of {s} (position {}): stepwise differs from one-by-one decoding", spec.offset() - s + i);
        }
        spec.trim(s - keep).unwrap();
        decode_one_by_one(m, &mut plain, &window[..keep]);
        assert_eq!(spec.offset(), plain.offset());
        pending = 3 + (pending * 11 + r as u32) % 500;
    }
}
