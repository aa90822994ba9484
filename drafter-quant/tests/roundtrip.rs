//! Round trips of tiny DeepSpec and DSpark checkpoints at 4 and 8 bits, groups 32 and 64:
//! what is written (names, dtypes, shapes, the quantization block), dequantized weights within
//! the affine error bound of the bf16 originals, kept tensors (confidence head included)
//! bit-exact, and the drafter loader reading the result back and drafting.

mod common;

use common::*;
use drafter_quant::{smoke, DrafterKind, Progress, Smoke, SmokeOutcome};
use gemma4::config::tiny_config_a;
use mlx_core::quant::{dequantize, QuantSpec};
use mlx_core::{Array, Dtype};
use serde_json::{json, Value};
use spec_decode::deepspec::DeepSpecDrafter;
use spec_decode::loader::load_drafter;

const CASES: [(u32, u32); 4] = [(4, 32), (4, 64), (8, 32), (8, 64)];

/// bf16's unit roundoff (half an ulp, relative).
const U: f32 = 1.0 / 256.0;

/// Checks every dequantized element against the affine error bound of MLX's quantizer and
/// returns max |w − ŵ|.
///
/// MLX computes q = clip(round((w − b) / s), 0, 2^bits − 1) with f32 `s`, `b` chosen so the
/// group's larger-magnitude edge is exact; clipping at the other edge can cost up to one step,
/// so |w − (s·q + b)| ≤ |s|. Storing `s` and `b` in bf16 and rounding ŵ to bf16 add
/// u·(q·|s| + |b| + |ŵ|), u = 2⁻⁸. So the bound per element is
/// |s|·(1 + u·(2^bits − 1)) + u·(|b| + |ŵ|) + 1e-6. (The plain |s| bound does not hold for
/// mx.quantize itself on bf16 weights: measured max |w − ŵ| / |s| is 1.05 at 4 bits and 2.5
/// at 8 bits with MLX 0.32.4.) The RMS relative error is checked too, to catch gross errors
/// the elementwise bound would allow.
fn check_affine_bound(
    name: &str,
    original: &Array,
    out: &std::collections::BTreeMap<String, Array>,
    module: &str,
    spec: QuantSpec,
) -> f32 {
    let (w, s, b) =
        (&out[&format!("{module}.weight")], &out[&format!("{module}.scales")], &out[&format!("{module}.biases")]);
    assert_eq!(w.dtype(), Dtype::U32, "{module}.weight is packed");
    assert_eq!((s.dtype(), b.dtype()), (Dtype::Bf16, Dtype::Bf16), "{module} scales/biases are bf16");
    let [rows, cols] = original.shape().unwrap()[..] else { panic!("{name} is not 2-D") };
    assert_eq!(w.shape().unwrap(), vec![rows, cols * spec.bits() as i32 / 32], "{module}.weight shape");
    assert_eq!(s.shape().unwrap(), vec![rows, cols / spec.group_size() as i32], "{module}.scales shape");
    assert_eq!(b.shape().unwrap(), s.shape().unwrap(), "{module}.biases shape");
    let deq = dequantize(w, s, b, spec).unwrap();
    assert_eq!(deq.dtype(), Dtype::Bf16, "{module} dequantizes to bf16");
    let f = |a: &Array| a.to_f32_vec().unwrap();
    let (orig, deq, scales, biases) = (f(original), f(&deq), f(s), f(b));
    let gs = spec.group_size() as usize;
    let levels = ((1u32 << spec.bits()) - 1) as f32;
    let (mut max_err, mut sq_err, mut sq) = (0f32, 0f64, 0f64);
    for (i, (&x, &y)) in orig.iter().zip(&deq).enumerate() {
        let (sc, bi) = (scales[i / gs].abs(), biases[i / gs].abs());
        let bound = sc * (1.0 + U * levels) + U * (bi + y.abs()) + 1e-6;
        let err = (x - y).abs();
        assert!(err <= bound, "{name} element {i}: |{x} − {y}| = {err} > bound {bound} (scale {sc}, bias {bi})");
        max_err = max_err.max(err);
        sq_err += (err as f64).powi(2);
        sq += (x as f64).powi(2);
    }
    let rel = (sq_err / sq).sqrt();
    let limit = if spec.bits() == 4 { 0.15 } else { 0.02 };
    assert!(rel < limit, "{name}: RMS relative error {rel} ≥ {limit} at {} bits", spec.bits());
    max_err
}

fn bytes(a: &Array) -> Vec<u8> {
    a.to_bytes().unwrap()
}

/// max |Δ| / max |logit| over the first draft row of two drafters on the same round of the
/// same target. Only row 0 measures numerics: it depends on the anchor alone, while later rows
/// add the Markov bias of the previous draft, which a near-tie flip changes wholesale.
fn first_row_gap(a: &std::path::Path, b: &std::path::Path) -> f32 {
    let target = smoke::tiny_target(0).unwrap();
    let v = target.config().vocab_size;
    let row0 = |dir: &std::path::Path| {
        let mut d = load_drafter(dir, target.config()).unwrap();
        let logits = smoke::draft_round(d.as_mut(), &target).unwrap().logits.unwrap().to_f32_vec().unwrap();
        logits[..v].to_vec()
    };
    let (x, y) = (row0(a), row0(b));
    let gap = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
    gap / x.iter().map(|p| p.abs()).fold(0.0, f32::max)
}

fn assert_progress(events: &[Progress], total: usize, kind: DrafterKind) {
    assert!(
        matches!(events.first(), Some(Progress::Start { kind: k, tensors, .. }) if *k == kind && *tensors == total)
    );
    let indices: Vec<usize> = events
        .iter()
        .filter_map(|e| if let Progress::Tensor { index, .. } = e { Some(*index) } else { None })
        .collect();
    assert_eq!(indices, (1..=total).collect::<Vec<_>>(), "one progress event per tensor, in order");
    assert!(matches!(events.last(), Some(Progress::Smoke(SmokeOutcome::Passed { .. }))), "smoke reported last");
}

#[test]
fn deepspec_round_trips() {
    for (bits, gs) in CASES {
        let s = Scratch::create("ds-rt");
        let src = write_deepspec(&s.join("src"), &deepspec_opts());
        let dst = s.join("q");
        let (r, events) = run(&src, &dst, &opts(bits, gs, Smoke::Auto));
        let r = r.unwrap_or_else(|e| panic!("{bits}-bit g{gs}: {e}"));
        let spec = QuantSpec::new(bits, gs).unwrap();
        let (inp, out) = (tensors(&src), tensors(&dst));
        assert_progress(&events, inp.len(), DrafterKind::DeepSpec);

        let mut n_quant = 0;
        for (name, a) in &inp {
            let module = name
                .strip_suffix(".weight")
                .filter(|_| a.ndim().unwrap() == 2 && !name.starts_with("confidence_head."));
            match module {
                Some(m) => {
                    n_quant += 1;
                    let err = check_affine_bound(name, a, &out, m, spec);
                    assert!(err > 0.0, "{name}: quantization changed nothing");
                }
                None => {
                    let o = &out[name];
                    assert_eq!((o.dtype(), o.shape().unwrap()), (a.dtype(), a.shape().unwrap()), "{name} kept as is");
                    assert_eq!(bytes(o), bytes(a), "{name} bit-exact");
                }
            }
        }
        for n in ["embed_tokens", "markov_head.markov_w1", "markov_head.markov_w2", "fc", "lm_head"] {
            assert!(out.contains_key(&format!("{n}.scales")), "{n} is quantized");
        }
        assert!(!out.contains_key("confidence_head.proj.scales"));
        assert_eq!(out["confidence_head.proj.weight"].dtype(), Dtype::Bf16);
        assert_eq!(out.len(), inp.len() + 2 * n_quant);
        assert_eq!((r.tensors_quantized, r.tensors_kept), (n_quant, inp.len() - n_quant));
        let bpw = bits as f64 + 32.0 / gs as f64;
        assert!((r.bits_per_weight - bpw).abs() < 1e-9, "bits per weight {} vs {bpw}", r.bits_per_weight);
        assert!(r.dst_bytes < r.src_bytes);
        assert!(matches!(r.smoke, SmokeOutcome::Passed { drafts: 5, vocab: 512, .. }), "{:?}", r.smoke);

        let (cfg_in, cfg_out) = (json(&src.join("config.json")), json(&dst.join("config.json")));
        let block = json!({"group_size": gs, "bits": bits, "mode": "affine", "confidence_head.proj": false});
        assert_eq!(cfg_out["quantization"], block);
        assert_eq!(cfg_out["quantization_config"], block);
        let mut stripped = cfg_out.clone();
        if let Value::Object(m) = &mut stripped {
            m.remove("quantization");
            m.remove("quantization_config");
        }
        assert_eq!(stripped, cfg_in, "config.json is otherwise a copy");

        // The DeepSpec loader reads it back unchanged: quantized fc projects one context row.
        let d = DeepSpecDrafter::load(&dst, &tiny_config_a()).unwrap();
        let row = Array::zeros(&[1, 1, 3 * 128], Dtype::Bf16).unwrap();
        assert_eq!(d.project_context(&row).unwrap().shape().unwrap(), vec![1, 1, 128]);
        if bits == 8 {
            let gap = first_row_gap(&src, &dst);
            assert!(gap > 0.0 && gap < 0.1, "8-bit first-row draft logits move by {gap} of their range");
        }
    }
}

#[test]
fn dspark_round_trips() {
    let matmuls = |name: &str| {
        let field = name.rsplit('.').next().unwrap_or("");
        (name.starts_with("bb.") && ["q", "k", "v", "o", "gate", "up", "down"].contains(&field))
            || ["W_c", "tok_proj", "out_proj", "markov.w2"].contains(&name)
    };
    for (bits, gs) in CASES {
        let s = Scratch::create("dsp-rt");
        let src = write_dspark(&s.join("src"), dspark_config(64));
        let dst = s.join("q");
        let (r, events) = run(&src, &dst, &opts(bits, gs, Smoke::Auto));
        let r = r.unwrap_or_else(|e| panic!("{bits}-bit g{gs}: {e}"));
        let spec = QuantSpec::new(bits, gs).unwrap();
        let (inp, out) = (tensors(&src), tensors(&dst));
        assert_progress(&events, inp.len(), DrafterKind::DSpark);

        let mut n_quant = 0;
        for (name, a) in &inp {
            assert_eq!(a.dtype(), Dtype::F32, "DSpark sources are f32");
            let bf16 = a.astype(Dtype::Bf16).unwrap();
            if matmuls(name) {
                n_quant += 1;
                assert!(!out.contains_key(name), "{name} itself is absent");
                check_affine_bound(name, &bf16.transpose(&[1, 0]).unwrap(), &out, name, spec);
            } else if name == "markov.w1" {
                n_quant += 1;
                assert!(!out.contains_key(name));
                check_affine_bound(name, &bf16, &out, name, spec);
            } else {
                let o = &out[name];
                assert_eq!((o.dtype(), o.shape().unwrap()), (Dtype::F32, a.shape().unwrap()), "{name} kept f32");
                assert_eq!(bytes(o), bytes(a), "{name} bit-exact");
            }
        }
        assert_eq!(n_quant, 2 * 7 + 5);
        for kept in
            ["conf.w", "conf.b", "mask_emb", "block_pos", "ctx_norm", "out_norm", "bb.0.attn_norm", "bb.1.ff_norm"]
        {
            assert!(out.contains_key(kept), "{kept} kept under its own key");
        }
        assert_eq!((r.tensors_quantized, r.tensors_kept), (n_quant, inp.len() - n_quant));
        assert!(matches!(r.smoke, SmokeOutcome::Passed { drafts: 4, vocab: 512, .. }), "{:?}", r.smoke);

        let (d_in, d_out) = (json(&src.join("dspark.json")), json(&dst.join("dspark.json")));
        let block = json!({"group_size": gs, "bits": bits, "mode": "affine", "conf.w": false, "conf.b": false});
        assert_eq!(d_out["quantization"], block);
        let mut stripped = d_out.clone();
        if let Value::Object(m) = &mut stripped {
            m.remove("quantization");
        }
        assert_eq!(stripped, d_in, "dspark.json is otherwise a copy");
        if bits == 8 {
            let gap = first_row_gap(&src, &dst);
            assert!(gap > 0.0 && gap < 0.1, "8-bit first-row draft logits move by {gap} of their range");
        }
    }
}

#[test]
fn small_shards_are_indexed_and_load() {
    let s = Scratch::create("shards");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    let dst = s.join("q");
    let o = drafter_quant::QuantizeOptions { shard_bytes: 64 << 10, ..opts(4, 64, Smoke::Auto) };
    let (r, _) = run(&src, &dst, &o);
    let r = r.unwrap();
    assert!(r.shards > 1, "expected several shards, got {}", r.shards);
    let index = json(&dst.join("model.safetensors.index.json"));
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), tensors(&dst).len());
    for f in map.values() {
        let f = f.as_str().unwrap();
        assert!(f.starts_with("model-") && f.ends_with(&format!("-of-{:05}.safetensors", r.shards)), "{f}");
    }
    assert_eq!(index["metadata"]["total_size"].as_u64(), Some(r.dst_bytes));
    assert!(matches!(r.smoke, SmokeOutcome::Passed { .. }));
    let leftovers: Vec<String> = s.entries();
    assert_eq!(leftovers, vec!["q".to_string(), "src".to_string()]);
    assert!(
        std::fs::read_dir(&dst).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().starts_with('.')),
        "no part files left"
    );
}

#[test]
fn aux_files_are_copied() {
    let s = Scratch::create("aux");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    std::fs::write(src.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(src.join("generation_config.json"), "{\"eos_token_id\": 1}").unwrap();
    let dst = s.join("q");
    run(&src, &dst, &opts(8, 64, Smoke::Off)).0.unwrap();
    assert_eq!(std::fs::read(dst.join("tokenizer.json")).unwrap(), b"{}");
    assert!(dst.join("generation_config.json").is_file());
}

/// `--dtype auto` on the CPU loads a quantized drafter dequantized: dense f32 weights holding
/// the quantization's values, drafting what the quantized drafter drafts up to rounding.
#[test]
fn a_quantized_drafter_loads_dequantized_when_asked() {
    let s = Scratch::create("dsp-dequant");
    let src = write_dspark(&s.join("src"), dspark_config(64));
    let dst = s.join("q");
    run(&src, &dst, &opts(8, 64, Smoke::Off)).0.unwrap();
    let target = smoke::tiny_target(0).unwrap();
    let packed = spec_decode::dspark::DSparkDrafter::load(&dst, target.config()).unwrap();
    assert!(packed.is_quantized());
    let dense = spec_decode::dspark::DSparkDrafter::load_as(&dst, target.config(), true).unwrap();
    assert!(!dense.is_quantized(), "every quantized matrix is dense after the load");
    assert!(dense.trainable_params().is_ok());
    // The same draft distribution as the packed drafter, to rounding.
    let v = target.config().vocab_size;
    let row0 = |mut d: Box<dyn spec_decode::Drafter>| {
        let logits = smoke::draft_round(d.as_mut(), &target).unwrap().logits.unwrap().to_f32_vec().unwrap();
        logits[..v].to_vec()
    };
    let (x, y) = (row0(Box::new(packed)), row0(Box::new(dense)));
    let scale = x.iter().map(|p| p.abs()).fold(0.0, f32::max);
    let gap = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
    assert!(gap <= 1e-2 * scale, "dequantized logits move by {gap} of {scale}");
    // Through the loader entry point too, DeepSpec included.
    let ds_src = write_deepspec(&s.join("ds"), &deepspec_opts());
    let ds_q = s.join("ds-q");
    run(&ds_src, &ds_q, &opts(8, 64, Smoke::Off)).0.unwrap();
    assert!(spec_decode::load_drafter_as(&ds_q, &tiny_config_a(), true).is_ok());
    assert!(spec_decode::load_drafter_as(&dst, target.config(), true).is_ok());
}
