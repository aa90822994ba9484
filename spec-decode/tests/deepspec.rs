//! The DeepSpec drafter on synthetic checkpoints: loading and every refusal, the fidelity traps
//! of docs/numerics.md, "DeepSpec drafter numerics" (Markov walk in the model dtype, k ≡ v
//! with a weightless unroped v, `layer_scalar` on the whole layer output, proportional RoPE
//! identity dims), context K/V caching exactness, sampled reproducibility, and quantized
//! checkpoints through gemma4's `WeightMap`.
//!
//! The target is gemma4's tiny config A (hidden 128, 6 layers, vocab 512) with random weights;
//! context rows are real tapped rows from `Model::forward_tapped`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use gemma4::checkpoint::{write_random_checkpoint, write_shards};
use gemma4::config::tiny_config_a;
use gemma4::sampling::SamplerConfig;
use gemma4::{Model, TapPoint, TapSet, TextConfig};
use mlx_core::quant::{quantize, QuantSpec};
use mlx_core::random::KeyChain;
use mlx_core::{concatenate, fast, Array, Dtype};
use serde_json::{json, Value};
use spec_decode::deepspec::DeepSpecDrafter;
use spec_decode::testing::{write_synthetic_deepspec, SyntheticDeepSpec};
use spec_decode::{DraftRequest, DraftSampling, Drafter, Proposal};

// ---------------------------------------------------------------------------------------------
// fixtures

fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    gemma4::testing::scratch(&format!("deepspec-{name}-{n}"))
}

struct Fx {
    cfg: TextConfig,
    model: Model,
    root: PathBuf,
}

fn fixture(name: &str) -> Fx {
    let root = scratch(name);
    let cfg = tiny_config_a();
    let tdir = write_random_checkpoint(&root.join("target"), &cfg, 1, Dtype::Bf16, 1, true).expect("target checkpoint");
    let model = Model::load(&tdir).expect("load target");
    Fx { cfg, model, root }
}

impl Drop for Fx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Fx {
    fn drafter_dir(&self, name: &str, opts: &SyntheticDeepSpec) -> PathBuf {
        write_synthetic_deepspec(&self.root.join(name), &self.cfg, opts).expect("synthetic drafter")
    }

    fn load(&self, dir: &Path) -> DeepSpecDrafter {
        DeepSpecDrafter::load(dir, &self.cfg).expect("load drafter")
    }

    /// Tapped rows of `ids` // `[1, L, taps·H]` bf16
    fn rows(&self, taps: &TapSet, ids: &[u32]) -> Array {
        let ids = Array::from_slice(ids, &[1, ids.len() as i32]).unwrap();
        self.model.forward_tapped(&ids, None, taps).unwrap().taps.expect("taps")
    }
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % 500 + 5) as u32).collect()
}

fn anchor(id: u32) -> Array {
    Array::from_slice(&[id], &[1]).unwrap()
}

fn greedy(d: &mut DeepSpecDrafter, id: u32, pos: usize, n: usize) -> Proposal {
    d.draft(&anchor(id), pos, n, DraftSampling::Greedy).expect("draft")
}

/// max |a| over all elements.
fn max_abs(a: &Array) -> f32 {
    a.astype(Dtype::F32)
        .unwrap()
        .abs()
        .unwrap()
        .reshape(&[-1])
        .unwrap()
        .max(&[0], false)
        .unwrap()
        .item::<f32>()
        .unwrap()
}

fn u32s(a: &Array) -> Vec<u32> {
    a.to_vec::<u32>().unwrap()
}

fn bits(a: &Array) -> Vec<u32> {
    a.astype(Dtype::F32).unwrap().to_f32_vec().unwrap().into_iter().map(f32::to_bits).collect()
}

fn assert_same_proposal(a: &Proposal, b: &Proposal) {
    assert_eq!(u32s(&a.tokens), u32s(&b.tokens), "tokens");
    assert_eq!(bits(a.logits.as_ref().unwrap()), bits(b.logits.as_ref().unwrap()), "logits");
    match (&a.confidence, &b.confidence) {
        (Some(x), Some(y)) => assert_eq!(bits(x), bits(y), "confidence"),
        (None, None) => {}
        _ => panic!("confidence presence differs"),
    }
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    f(v.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// Loads every tensor (evaluated), applies `f`, rewrites the checkpoint as one shard.
fn edit_tensors(dir: &Path, f: impl FnOnce(&mut BTreeMap<String, Array>)) {
    let mut t = gemma4::weights::load_raw(dir).unwrap();
    mlx_core::eval(&t.values().collect::<Vec<_>>()).unwrap();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let n = e.file_name().to_string_lossy().to_string();
        if n.starts_with("model") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    f(&mut t);
    write_shards(dir, &t, 1).unwrap();
}

fn tensor(dir: &Path, name: &str) -> Array {
    gemma4::weights::load_raw(dir).unwrap().remove(name).unwrap_or_else(|| panic!("{name}"))
}

/// A drafter with its context reset on the tapped rows of `prompt(len)`.
fn ready(fx: &Fx, dir: &Path, len: usize) -> DeepSpecDrafter {
    let mut d = fx.load(dir);
    let rows = fx.rows(&d.taps(), &prompt(len));
    d.reset(Some(&rows), len).unwrap();
    d
}

// ---------------------------------------------------------------------------------------------
// loading

#[test]
fn load_round_trip_and_trait_propose() {
    let fx = fixture("roundtrip");
    let opts = SyntheticDeepSpec::default();
    let dir = fx.drafter_dir("d", &opts);
    let mut d = fx.load(&dir);
    assert_eq!(d.name(), "deepspec");
    assert_eq!(d.gamma(), 5);
    assert_eq!(
        d.taps(),
        TapSet::new([TapPoint::Layer(1), TapPoint::Layer(3), TapPoint::FinalNorm]),
        "the last target layer is read after the final norm (HF hidden_states)"
    );
    assert_eq!(d.thresholds(), None);
    let c = d.config();
    assert_eq!((c.hidden_size, c.vocab_size, c.num_hidden_layers, c.head_dim, c.num_kv_heads), (128, 512, 2, 32, 1));
    assert_eq!((c.markov_rank, c.mask_token_id, c.rotated_pairs()), (16, 4, 4));
    assert_eq!(c.final_logit_softcapping, Some(30.0));
    assert_eq!(d.dtype(), Dtype::Bf16);

    let rows = fx.rows(&d.taps(), &prompt(6));
    d.reset(Some(&rows), 6).unwrap();
    assert_eq!(d.context_len(), 6);
    let cache = fx.model.new_cache();
    let a = anchor(42);
    let p = d
        .propose(DraftRequest {
            anchor: &a,
            position: 6,
            max_drafts: 5,
            sampling: DraftSampling::Greedy,
            target: &fx.model,
            target_cache: &cache,
        })
        .unwrap();
    assert_eq!((p.len().unwrap(), p.tokens.dtype()), (5, Dtype::U32));
    let logits = p.logits.as_ref().unwrap();
    assert_eq!((logits.shape().unwrap(), logits.dtype()), (vec![5, 512], Dtype::F32));
    let conf = p.confidence.as_ref().unwrap().to_f32_vec().unwrap();
    assert_eq!(conf.len(), 5);
    assert!(conf.iter().all(|&c| c > 0.0 && c < 1.0), "confidence in (0,1): {conf:?}");
    assert!(u32s(&p.tokens).iter().all(|&t| t < 512));

    // A sharded copy of the same weights drafts the same block.
    let sharded = fx.drafter_dir("sharded", &SyntheticDeepSpec { shards: 3, ..opts });
    assert!(sharded.join("model-00001-of-00003.safetensors").is_file());
    let mut s = fx.load(&sharded);
    s.reset(Some(&rows), 6).unwrap();
    assert_same_proposal(&greedy(&mut s, 42, 6, 5), &p);
}

#[test]
fn no_markov_no_confidence_head() {
    let fx = fixture("plain");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec { markov_rank: 0, confidence_head: false, ..Default::default() });
    let mut d = ready(&fx, &dir, 4);
    let p = greedy(&mut d, 9, 4, 5);
    assert!(p.confidence.is_none());
    let base = d.draft_block(&anchor(9), 4).unwrap().base_logits;
    assert_eq!(u32s(&p.tokens), u32s(&base.argmax(-1, false).unwrap().reshape(&[-1]).unwrap()));
}

fn refused(fx: &Fx, name: &str, edit: impl FnOnce(&Path)) -> String {
    let dir = fx.drafter_dir(name, &SyntheticDeepSpec::default());
    edit(&dir);
    match DeepSpecDrafter::load(&dir, &fx.cfg) {
        Ok(_) => panic!("{name}: loaded a broken checkpoint"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn config_refusals_name_file_and_key() {
    let fx = fixture("refuse-config");
    type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "arch",
            Box::new(|m| drop(m.insert("architectures".into(), json!(["Gemma4ForCausalLM"])))),
            "Gemma4DSparkModel",
        ),
        ("keqv", Box::new(|m| drop(m.insert("attention_k_eq_v".into(), json!(false)))), "attention_k_eq_v=false"),
        ("gated", Box::new(|m| drop(m.insert("markov_head_type".into(), json!("gated")))), "markov_head_type"),
        ("act", Box::new(|m| drop(m.insert("hidden_activation".into(), json!("gelu")))), "hidden_activation"),
        ("noblock", Box::new(|m| drop(m.remove("block_size"))), "block_size"),
        ("notaps", Box::new(|m| drop(m.insert("target_layer_ids".into(), json!([])))), "target_layer_ids"),
        (
            "gqa",
            Box::new(|m| drop(m.insert("num_global_key_value_heads".into(), json!(3)))),
            "num_global_key_value_heads",
        ),
        ("mask", Box::new(|m| drop(m.insert("mask_token_id".into(), json!(512)))), "mask_token_id"),
        ("type", Box::new(|m| drop(m.insert("block_size".into(), json!("five")))), "block_size"),
        ("huge", Box::new(|m| drop(m.insert("hidden_size".into(), json!(1u64 << 33)))), "hidden_size"),
        ("threshold", Box::new(|m| drop(m.insert("confidence_threshold".into(), json!(1.5)))), "confidence_threshold"),
        (
            "rope",
            Box::new(|m| drop(m.insert("rope_parameters".into(), json!({"full_attention": {"rope_type": "yarn"}})))),
            "rope_type",
        ),
    ];
    for (name, f, want) in cases {
        let msg = refused(&fx, name, |dir| edit_config(dir, f));
        assert!(msg.contains("config.json") && msg.contains(want), "{name}: {msg}");
    }
}

#[test]
fn target_mismatches_are_incompatible() {
    let fx = fixture("refuse-target");
    let msg = refused(&fx, "depth", |dir| edit_config(dir, |m| drop(m.insert("num_target_layers".into(), json!(5)))));
    assert!(msg.contains("5-layer target") && msg.contains("6 layers"), "{msg}");
    let msg =
        refused(&fx, "tap", |dir| edit_config(dir, |m| drop(m.insert("target_layer_ids".into(), json!([1, 3, 6])))));
    assert!(msg.contains("layer 6 is out of range"), "{msg}");
    let msg = refused(&fx, "fc", |dir| edit_config(dir, |m| drop(m.insert("target_layer_ids".into(), json!([1, 3])))));
    assert!(msg.contains("fc.weight takes 384 features"), "{msg}");

    let dir = fx.drafter_dir("dims", &SyntheticDeepSpec::default());
    let mut other = fx.cfg.clone();
    other.hidden_size = 64;
    let msg = DeepSpecDrafter::load(&dir, &other).map(drop).expect_err("hidden mismatch").to_string();
    assert!(msg.contains("hidden_size 128 != target hidden_size 64"), "{msg}");
    let mut other = fx.cfg.clone();
    other.vocab_size = 1024;
    let msg = DeepSpecDrafter::load(&dir, &other).map(drop).expect_err("vocab mismatch").to_string();
    assert!(msg.contains("vocab_size 512 != target vocab_size 1024"), "{msg}");
}

#[test]
fn tensor_refusals_name_the_tensor() {
    let fx = fixture("refuse-tensors");
    let msg = refused(&fx, "missing", |dir| edit_tensors(dir, |t| drop(t.remove("layers.1.self_attn.k_norm.weight"))));
    assert!(msg.contains("missing tensor") && msg.contains("layers.1.self_attn.k_norm.weight"), "{msg}");
    let msg = refused(&fx, "shape", |dir| {
        edit_tensors(dir, |t| {
            drop(t.insert("layers.0.self_attn.q_norm.weight".into(), Array::ones(&[16], Dtype::Bf16).unwrap()))
        })
    });
    assert!(msg.contains("layers.0.self_attn.q_norm.weight") && msg.contains("[16]") && msg.contains("[32]"), "{msg}");
    let msg = refused(&fx, "extra", |dir| {
        edit_tensors(dir, |t| {
            drop(t.insert("layers.0.self_attn.v_proj.weight".into(), Array::zeros(&[32, 128], Dtype::Bf16).unwrap()))
        })
    });
    assert!(msg.contains("not used") && msg.contains("v_proj"), "{msg}");
    let msg = refused(&fx, "scales", |dir| {
        edit_tensors(dir, |t| drop(t.insert("lm_head.scales".into(), Array::zeros(&[512, 2], Dtype::Bf16).unwrap())))
    });
    assert!(msg.contains("lm_head has quantized tensors (.scales sibling) but no quantization config entry"), "{msg}");
}

#[test]
fn contract_errors() {
    let fx = fixture("contract");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let mut d = fx.load(&dir);
    let e = d.draft(&anchor(1), 0, 5, DraftSampling::Greedy).expect_err("before reset").to_string();
    assert!(e.contains("before reset"), "{e}");
    assert!(d.reset(None, 0).is_err());
    let rows = fx.rows(&d.taps(), &prompt(5));
    let e = d.reset(Some(&rows), 4).expect_err("row count").to_string();
    assert!(e.contains("[1, 5, 384]") && e.contains("[1, 4, 384]"), "{e}");
    d.reset(Some(&rows), 5).unwrap();
    let e = d.draft(&anchor(1), 4, 5, DraftSampling::Greedy).expect_err("position").to_string();
    assert!(e.contains("anchor position 4 != committed context length 5"), "{e}");
    assert!(d.draft(&anchor(1), 5, 0, DraftSampling::Greedy).is_err(), "0 drafts");
    let e = d.commit(Some(&rows.slice_axis(2, 0, 128).unwrap()), 5).expect_err("width").to_string();
    assert!(e.contains("[1, 5, 128]"), "{e}");
    assert!(d.commit(None, 1).is_err());
    assert_eq!(d.context_len(), 5, "failed commits change nothing");
}

#[test]
fn confidence_threshold_becomes_per_position_thresholds() {
    let fx = fixture("threshold");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    edit_config(&dir, |m| drop(m.insert("confidence_threshold".into(), json!(0.5))));
    assert_eq!(fx.load(&dir).thresholds(), Some(vec![0.0, 0.5, 0.5, 0.5, 0.5]));
    // Asked for (the checkpoint's own thresholds), a threshold of 1 keeps one draft per round.
    edit_config(&dir, |m| drop(m.insert("confidence_threshold".into(), json!(1.0))));
    let mut d = fx.load(&dir);
    let sc = spec_decode::SpecConfig {
        generate: gemma4::generate::GenerateConfig { max_tokens: 12, ..Default::default() },
        pruning: spec_decode::Pruning::Calibrated,
        ..Default::default()
    };
    let out = spec_decode::speculative_generate(&fx.model, &mut d, &prompt(6), &sc, |_| {}).unwrap();
    assert!(out.stats.rounds > 0 && out.stats.drafted == out.stats.rounds, "{}", out.stats.summary());
}

// ---------------------------------------------------------------------------------------------
// numerics

#[test]
fn zero_markov_w2_gives_argmax_of_base_logits() {
    let fx = fixture("zero-w2");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    edit_tensors(&dir, |t| {
        drop(t.insert("markov_head.markov_w2.weight".into(), Array::zeros(&[512, 16], Dtype::Bf16).unwrap()))
    });
    let mut d = ready(&fx, &dir, 6);
    let p = greedy(&mut d, 77, 6, 5);
    let base = d.draft_block(&anchor(77), 6).unwrap().base_logits.reshape(&[5, 512]).unwrap(); // [γ, V]
    assert_eq!(u32s(&p.tokens), u32s(&base.argmax(-1, false).unwrap()));
    assert_eq!(bits(p.logits.as_ref().unwrap()), bits(&base), "a zero bias leaves the step logits = base");
}

#[test]
fn markov_walk_matches_a_reference_walk() {
    let fx = fixture("walk");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let mut d = ready(&fx, &dir, 6);
    let p = greedy(&mut d, 123, 6, 5);
    let block = d.draft_block(&anchor(123), 6).unwrap();
    let (w1, w2) = (tensor(&dir, "markov_head.markov_w1.weight"), tensor(&dir, "markov_head.markov_w2.weight"));
    let (cw, cb) = (tensor(&dir, "confidence_head.proj.weight"), tensor(&dir, "confidence_head.proj.bias"));
    let mut prev = 123u32;
    let (mut toks, mut steps, mut confs) = (vec![], vec![], vec![]);
    for k in 0..5 {
        let e1 = w1.take(&anchor(prev), 0).unwrap(); // [1, r] bf16
        let bias = e1.matmul(&w2.transpose(&[1, 0]).unwrap()).unwrap(); // [1, V] bf16
        let step = block.base_logits.slice_axis(1, k, k + 1).unwrap().reshape(&[1, 512]).unwrap().add(&bias).unwrap();
        assert_eq!(step.dtype(), Dtype::Bf16, "the Markov sum stays in the model dtype");
        let h_k = block.hidden.slice_axis(1, k, k + 1).unwrap().reshape(&[1, 128]).unwrap();
        let z =
            concatenate(&[&h_k, &e1], -1).unwrap().matmul(&cw.transpose(&[1, 0]).unwrap()).unwrap().add(&cb).unwrap();
        confs.push(z.astype(Dtype::F32).unwrap().sigmoid().unwrap().item::<f32>().unwrap());
        prev = step.argmax(-1, false).unwrap().item::<u32>().unwrap();
        toks.push(prev);
        steps.push(step.astype(Dtype::F32).unwrap());
    }
    assert_eq!(u32s(&p.tokens), toks);
    let steps = concatenate(&steps, 0).unwrap();
    assert_eq!(
        bits(p.logits.as_ref().unwrap()),
        bits(&steps),
        "the returned logits are the step logits, Markov bias included, not the base logits"
    );
    let conf = p.confidence.unwrap().to_f32_vec().unwrap();
    assert_eq!(
        conf.iter().map(|c| c.to_bits()).collect::<Vec<_>>(),
        confs.iter().map(|c| c.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn zero_layer_scalar_on_last_layer_zeroes_base_logits() {
    let fx = fixture("scalar");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    edit_tensors(&dir, |t| drop(t.insert("layers.1.layer_scalar".into(), Array::zeros(&[1], Dtype::Bf16).unwrap())));
    let mut d = ready(&fx, &dir, 6);
    let block = d.draft_block(&anchor(5), 6).unwrap();
    let max = max_abs(&block.base_logits);
    assert!(max < 1e-6, "layer_scalar scales the whole layer output incl. residual: max |logit| = {max}");
    // And the scalar is live: the unedited drafter has non-trivial logits.
    let mut live = ready(&fx, &fx.drafter_dir("live", &SyntheticDeepSpec::default()), 6);
    let base = live.draft_block(&anchor(5), 6).unwrap().base_logits;
    assert!(max_abs(&base) > 0.1);
}

#[test]
fn v_is_the_unroped_weightless_norm_of_k() {
    let fx = fixture("kv");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let d = ready(&fx, &dir, 6);
    let rows = fx.rows(&d.taps(), &prompt(6));
    let ctx = d.project_context(&rows).unwrap(); // [1, 6, 128]
    assert_eq!(ctx.shape().unwrap(), vec![1, 6, 128]);
    let eps = d.config().rms_norm_eps;
    for layer in 0..2 {
        let kw = tensor(&dir, &format!("layers.{layer}.self_attn.k_proj.weight"));
        let knorm = tensor(&dir, &format!("layers.{layer}.self_attn.k_norm.weight"));
        let raw = ctx.matmul(&kw.transpose(&[1, 0]).unwrap()).unwrap().reshape(&[1, 6, 1, 32]).unwrap();
        let v_ref = fast::rms_norm(&raw, None, eps).unwrap().transpose(&[0, 2, 1, 3]).unwrap();
        let k_unroped = fast::rms_norm(&raw, Some(&knorm), eps).unwrap().transpose(&[0, 2, 1, 3]).unwrap(); // [1, 1, 6, 32]
        let kv = &d.context().unwrap().layers().unwrap()[layer];
        assert_eq!(kv.v.shape().unwrap(), vec![1, 1, 6, 32]);
        assert_eq!(bits(&kv.v), bits(&v_ref), "v = weightless RMSNorm of the raw k_proj output, no rope");
        assert_ne!(bits(&kv.v), bits(&kv.k), "v ≠ roped k");
        let (k, ku) = (
            kv.k.astype(Dtype::F32).unwrap().to_f32_vec().unwrap(),
            k_unroped.astype(Dtype::F32).unwrap().to_f32_vec().unwrap(),
        );
        // Position 0 is unrotated; at p > 0 only the first 4 pairs (32 · 0.25 = 8 dims) rotate:
        // dims j and j + 16 for j < 4; the other pairs have wavelength +∞ (identity).
        for p in 0..6 {
            for j in 0..32 {
                let (a, b) = (k[p * 32 + j], ku[p * 32 + j]);
                let rotated = j % 16 < 4;
                if p == 0 || !rotated {
                    assert_eq!(a.to_bits(), b.to_bits(), "layer {layer} pos {p} dim {j} must pass through");
                }
            }
        }
        let moved = (1..6).any(|p| (0..4).any(|j| k[p * 32 + j] != ku[p * 32 + j]));
        assert!(moved, "rotated dims must change at p > 0");
    }
}

// ---------------------------------------------------------------------------------------------
// context caching

#[test]
fn context_caching_is_exact() {
    let fx = fixture("cache");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let mut inc = fx.load(&dir);
    let taps = inc.taps();
    let all = fx.rows(&taps, &prompt(8)); // [1, 8, 384]
    inc.reset(Some(&all.slice_axis(1, 0, 4).unwrap()), 4).unwrap();
    let _ = greedy(&mut inc, 3, 4, 5); // proposals in between never touch the cache
    inc.commit(Some(&all.slice_axis(1, 4, 5).unwrap()), 1).unwrap();
    inc.commit(Some(&all.slice_axis(1, 5, 8).unwrap()), 3).unwrap();
    assert_eq!(inc.context_len(), 8);

    let mut fresh = fx.load(&dir);
    fresh.reset(Some(&all), 8).unwrap();
    for (a, b) in inc.context().unwrap().layers().unwrap().iter().zip(fresh.context().unwrap().layers().unwrap()) {
        assert_eq!(bits(&a.k), bits(&b.k), "cached k");
        assert_eq!(bits(&a.v), bits(&b.v), "cached v");
    }
    assert_same_proposal(&greedy(&mut inc, 200, 8, 5), &greedy(&mut fresh, 200, 8, 5));

    // An empty context grows the same way.
    let mut empty = fx.load(&dir);
    empty.reset(Some(&all.slice_axis(1, 0, 0).unwrap()), 0).unwrap();
    assert_eq!(greedy(&mut empty, 7, 0, 5).len().unwrap(), 5, "drafting on an empty context");
    empty.commit(Some(&all.slice_axis(1, 0, 3).unwrap()), 3).unwrap();
    let mut three = fx.load(&dir);
    three.reset(Some(&all.slice_axis(1, 0, 3).unwrap()), 3).unwrap();
    assert_same_proposal(&greedy(&mut empty, 7, 3, 5), &greedy(&mut three, 7, 3, 5));
}

#[test]
fn max_drafts_takes_a_prefix() {
    let fx = fixture("prefix");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let mut d = ready(&fx, &dir, 6);
    let full = greedy(&mut d, 50, 6, 5);
    let two = greedy(&mut d, 50, 6, 2);
    assert_same_proposal(&two, &full.truncate(2).unwrap());
    assert_eq!(greedy(&mut d, 50, 6, 9).len().unwrap(), 5, "clamped to γ");
}

// ---------------------------------------------------------------------------------------------
// sampling

#[test]
fn sampled_proposals_are_reproducible_and_carry_logits() {
    let fx = fixture("sample");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    let mut d = ready(&fx, &dir, 6);
    let cfg = SamplerConfig { temperature: 1.5, top_k: 50, ..SamplerConfig::default() };
    let mut run = |seed: u64| {
        let mut keys = KeyChain::new(seed).unwrap();
        d.draft(&anchor(31), 6, 5, DraftSampling::Sample { cfg: &cfg, keys: &mut keys }).unwrap()
    };
    let (a, b) = (run(7), run(7));
    assert_same_proposal(&a, &b);
    let logits = a.logits.as_ref().expect("sampled proposals always return q's logits");
    assert_eq!(logits.shape().unwrap(), vec![5, 512]);
    // Every sampled token is inside the filtered support of its own row (q(x) > 0).
    let q = spec_decode::probs::probabilities(logits, &cfg).unwrap().to_f32_vec().unwrap();
    for (k, t) in u32s(&a.tokens).into_iter().enumerate() {
        assert!(q[k * 512 + t as usize] > 0.0, "position {k}: token {t} has q = 0");
    }
    let conf = a.confidence.unwrap().to_f32_vec().unwrap();
    assert!(conf.iter().all(|&c| c > 0.0 && c < 1.0));
    // Different seeds differ somewhere over a few draws (temperature 1.5 over 50 tokens).
    let differs = (8..12).any(|s| u32s(&run(s).tokens) != u32s(&a.tokens));
    assert!(differs, "sampling ignores the keys");
}

// ---------------------------------------------------------------------------------------------
// quantized siblings

/// Quantizes every eligible 2-D weight (last dim divisible by `group`), keeps
/// `confidence_head.*` full precision via a `false` entry (the drafter-quant policy).
fn quantize_dir(dir: &Path, bits_: u32, group: u32) {
    let spec = QuantSpec::new(bits_, group).unwrap();
    edit_tensors(dir, |t| {
        let names: Vec<String> = t.keys().cloned().collect();
        for name in names {
            let Some(base) = name.strip_suffix(".weight") else { continue };
            if base.starts_with("confidence_head")
                || t[&name].ndim().unwrap() != 2
                || t[&name].dim(-1).unwrap() % group as i32 != 0
            {
                continue;
            }
            let q = quantize(&t[&name], spec).unwrap();
            t.insert(format!("{base}.scales"), q.scales);
            t.insert(format!("{base}.biases"), q.biases);
            t.insert(name, q.weight);
        }
    });
    edit_config(dir, |m| {
        let block = json!({"group_size": group, "bits": bits_, "mode": "affine", "confidence_head.proj": false});
        m.insert("quantization".into(), block.clone());
        m.insert("quantization_config".into(), block);
    });
}

#[test]
fn quantized_checkpoint_loads_through_weightmap() {
    let fx = fixture("quant");
    let bf16 = fx.drafter_dir("bf16", &SyntheticDeepSpec::default());
    let q8 = fx.drafter_dir("q8", &SyntheticDeepSpec::default());
    quantize_dir(&q8, 8, 32);
    assert!(gemma4::weights::load_raw(&q8).unwrap().contains_key("fc.scales"));
    let (mut a, mut b) = (ready(&fx, &bf16, 6), ready(&fx, &q8, 6));
    let rows = fx.rows(&a.taps(), &prompt(1));
    assert_eq!(b.project_context(&rows).unwrap().shape().unwrap(), vec![1, 1, 128], "load smoke: projectContext shape");
    let (pa, pb) = (greedy(&mut a, 60, 6, 5), greedy(&mut b, 60, 6, 5));
    let delta = max_abs(&pa.logits.unwrap().subtract(pb.logits.as_ref().unwrap()).unwrap());
    assert!(delta > 0.0 && delta < 0.5, "8-bit drafter moves logits a little: max |Δ| = {delta}");
    assert_eq!(u32s(&pa.tokens), u32s(&pb.tokens));
}

#[test]
fn config_errors_are_structured() {
    use gemma4::config::ConfigError;
    let fx = fixture("structured-config");
    let dir = fx.drafter_dir("d", &SyntheticDeepSpec::default());
    std::fs::write(dir.join("config.json"), "[1, 2]").unwrap();
    let e = DeepSpecDrafter::load(&dir, &fx.cfg).map(drop).expect_err("an array is no config");
    let spec_decode::Error::Config(ConfigError::InFile { path, source }) = &e else { panic!("{e:?}") };
    assert!(path.ends_with("config.json"));
    assert!(matches!(**source, ConfigError::Invalid { ref field, .. } if field == "config"), "{source:?}");
    assert!(e.to_string().contains("a JSON object"), "{e}");
}
