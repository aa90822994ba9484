//! Model-level invariants that need no reference implementation: tap invariance, cached versus
//! uncached forwards, loader round trips through every on-disk layout.

mod common;

use gemma4::checkpoint::{quantize_checkpoint, write_hf_layout};
use gemma4::generate::{generate, ids_array, prefill, GenerateConfig};
use gemma4::{Model, TapPoint, TapSet};
use mlx_core::Array;

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 37) % 500).collect()
}

fn bytes(a: &Array) -> Vec<u8> {
    a.to_bytes().unwrap()
}

#[test]
fn tap_does_not_change_logits() {
    let m = Model::load(common::tiny_a()).unwrap();
    let ids = ids_array(&prompt(21)).unwrap();
    let plain = m.logits(&ids, None).unwrap();
    let taps = TapSet::new([TapPoint::Layer(1), TapPoint::Layer(4), TapPoint::FinalNorm]);
    let out = m.forward_tapped(&ids, None, &taps).unwrap();
    let tapped = m.logits_from_hidden(&out.hidden).unwrap();
    assert_eq!(bytes(&plain), bytes(&tapped), "logits must be bit-identical with the tap on");
    let t = out.taps.unwrap();
    assert_eq!(t.shape(), vec![1, 21, 3 * 128]);
    // The last tap slot is the post-norm hidden itself.
    assert_eq!(bytes(&t.slice_axis(-1, 256, 384).unwrap()), bytes(&out.hidden));
    let bad = m.forward_tapped(&ids, None, &TapSet::layers(&[99]));
    assert!(bad.unwrap_err().to_string().contains("99"));
}

#[test]
fn cached_decode_matches_uncached_forward() {
    let m = Model::load(common::tiny_a()).unwrap();
    let p = prompt(21);
    let full = m.logits(&ids_array(&p).unwrap(), None).unwrap().to_f32_vec().unwrap();
    let mut cache = m.new_cache();
    let last = prefill(&m, &mut cache, &p, 5).unwrap().to_f32_vec().unwrap();
    let v = 512;
    let want = &full[20 * v..21 * v];
    let max = want.iter().zip(&last).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(max < 0.1, "cached vs uncached last-position logits differ by {max}");
    assert_eq!(cache.offset(), 21);
}

#[test]
fn every_layout_loads_to_the_same_logits() {
    let src = common::tiny_a();
    let m = Model::load(src).unwrap();
    let ids = ids_array(&prompt(12)).unwrap();
    let want = bytes(&m.logits(&ids, None).unwrap());
    let hf = write_hf_layout(src, &common::scratch("tiny-a-hf"), true).unwrap();
    let m_hf = Model::load(&hf).unwrap();
    assert_eq!(bytes(&m_hf.logits(&ids, None).unwrap()), want, "HF naming must load bit-identically");
    let q = quantize_checkpoint(src, &common::scratch("tiny-a-q4"), 4, 64, true).unwrap();
    let mq = Model::load(&q).unwrap();
    let lq = mq.logits(&ids, None).unwrap().to_f32_vec().unwrap();
    assert_eq!(lq.len(), 12 * 512);
    assert!(lq.iter().all(|x| x.is_finite()));
}

#[test]
fn moe_config_runs_in_f32() {
    let m = Model::load(common::tiny_b_f32()).unwrap();
    let cfg = GenerateConfig { max_tokens: 8, ..Default::default() };
    let g = generate(&m, &prompt(10), &cfg, |_| {}).unwrap();
    assert_eq!(g.tokens.len(), 8);
}
