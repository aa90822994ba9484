//! DSpark checkpoints: save/load round trip, the loader's refusals, and context caching.

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::{tiny_config_a, tiny_config_b};
use gemma4::generate::GenerateConfig;
use gemma4::{Model, TextConfig};
use mlx_core::{concatenate, Array, Dtype};
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::loader::{detect, load_drafter, DrafterKind};
use spec_decode::{DraftRequest, DraftSampling, Drafter, Error};

fn scratch(name: &str) -> PathBuf {
    gemma4::testing::scratch(&format!("dspark-{name}"))
}

fn target_dir() -> &'static PathBuf {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| write_random_checkpoint(&scratch("target"), &tiny_config_a(), 5, Dtype::Bf16, 1, true).unwrap())
}

fn target() -> (&'static PathBuf, Model) {
    let dir = target_dir();
    (dir, Model::load(dir).unwrap())
}

fn cfg(gamma: usize, taps: Vec<usize>) -> DSparkConfig {
    DSparkConfig { gamma, ..DSparkConfig::with_taps(taps) }
}

fn tapped_rows(m: &Model, d: &dyn Drafter, ids: &[u32]) -> Array {
    let a = gemma4::generate::ids_array(ids).unwrap();
    m.forward_tapped(&a, None, &d.taps()).unwrap().taps.unwrap()
}

fn propose_greedy(m: &Model, d: &mut dyn Drafter, anchor: u32, pos: usize) -> (Vec<u32>, Vec<u8>, Vec<f32>) {
    let cache = m.new_cache();
    let a = Array::from_slice(&[anchor], &[1]).unwrap();
    let req = DraftRequest {
        anchor: &a,
        position: pos,
        max_drafts: 4,
        sampling: DraftSampling::Greedy,
        target: m,
        target_cache: &cache,
    };
    let p = d.propose(req).unwrap();
    (
        p.tokens.to_vec::<u32>().unwrap(),
        p.logits.unwrap().to_bytes().unwrap(),
        p.confidence.unwrap().to_f32_vec().unwrap(),
    )
}

#[test]
fn save_load_round_trip_is_bit_exact() {
    let (_, m) = &target();
    let mut a = DSparkDrafter::init(cfg(4, vec![1, 3, 6]), m.config(), "tiny", 3, true).unwrap();
    let dir = a.save(&scratch("rt"), false).unwrap();
    assert_eq!(detect(&dir).unwrap(), DrafterKind::DSpark);
    let mut b = load_drafter(&dir, m.config()).unwrap();
    let ids: Vec<u32> = (4..14).collect();
    let rows = tapped_rows(m, &a, &ids);
    a.reset(Some(&rows), ids.len()).unwrap();
    b.reset(Some(&rows), ids.len()).unwrap();
    assert_eq!(propose_greedy(m, &mut a, 20, ids.len()), propose_greedy(m, b.as_mut(), 20, ids.len()));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dspark.json")).unwrap()).unwrap();
    assert_eq!(json["kind"], "dspark-drafter");
    assert_eq!(json["variant"], "dspark");
    assert_eq!(json["target_id"], "tiny@128x512");
    assert_eq!(json["config"]["gamma"], 4);
    assert_eq!(json["dims"]["hiddenSize"], 128);
    assert_eq!(json["param_names"].as_array().unwrap().len(), 2 * 9 + 11);
    // No temporary directory is left beside the checkpoint.
    let parent = dir.parent().unwrap();
    assert!(std::fs::read_dir(parent).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().contains(".tmp-")));
}

#[test]
fn cached_context_equals_reprojecting_everything() {
    let (_, m) = &target();
    let mut inc = DSparkDrafter::init(cfg(4, vec![0, 2, 5]), m.config(), "tiny", 9, true).unwrap();
    let mut full = DSparkDrafter::init(cfg(4, vec![0, 2, 5]), m.config(), "tiny", 9, true).unwrap();
    let ids: Vec<u32> = (30..42).collect();
    let rows = tapped_rows(m, &inc, &ids);
    inc.reset(Some(&rows.slice_axis(1, 0, 7).unwrap()), 7).unwrap();
    inc.commit(Some(&rows.slice_axis(1, 7, 9).unwrap()), 2).unwrap();
    inc.commit(Some(&rows.slice_axis(1, 9, 12).unwrap()), 3).unwrap();
    full.reset(Some(&rows), 12).unwrap();
    assert_eq!(inc.context_len(), 12);
    assert_eq!(propose_greedy(m, &mut inc, 7, 12), propose_greedy(m, &mut full, 7, 12));
    assert!(inc.commit(Some(&rows.slice_axis(1, 0, 2).unwrap()), 3).is_err(), "row count must match");
}

#[test]
fn confidence_is_a_probability() {
    let (_, m) = &target();
    let mut d = DSparkDrafter::init(cfg(4, vec![1]), m.config(), "tiny", 1, true).unwrap();
    let rows = tapped_rows(m, &d, &[5, 6, 7]);
    d.reset(Some(&rows), 3).unwrap();
    let (tokens, _, conf) = propose_greedy(m, &mut d, 8, 3);
    assert_eq!(tokens.len(), 4);
    assert!(conf.iter().all(|c| *c > 0.0 && *c < 1.0), "{conf:?}");
    let zero = DSparkDrafter::init(cfg(4, vec![1]), m.config(), "tiny", 1, false).unwrap();
    let mut zero = zero;
    zero.reset(Some(&rows), 3).unwrap();
    let (_, _, c) = propose_greedy(m, &mut zero, 8, 3);
    assert!(c.iter().all(|&x| x == 0.5), "zero-init confidence head gives 0.5: {c:?}");
}

fn err_text(r: spec_decode::Result<Box<dyn Drafter>>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn loader_refusals_name_the_problem() {
    let (target_dir, m) = &target();
    let d = DSparkDrafter::init(cfg(4, vec![1, 3]), m.config(), "tiny", 3, false).unwrap();
    let good = d.save(&scratch("good"), false).unwrap();
    let copy = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let dir = scratch(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(good.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(good.join("dspark.json")).unwrap()).unwrap();
        edit(&mut v);
        std::fs::write(dir.join("dspark.json"), v.to_string()).unwrap();
        dir
    };
    // v1 single-vector checkpoints: no variant.
    let v1 = copy("v1", &|v| {
        v.as_object_mut().unwrap().remove("variant");
    });
    let e = err_text(load_drafter(&v1, m.config()));
    assert!(e.contains("v1") && e.contains("superseded") && e.contains("retrain"), "{e}");
    let kind = copy("kind", &|v| v["kind"] = "something-else".into());
    assert!(err_text(load_drafter(&kind, m.config())).contains("kind"));
    let taps = copy("taps", &|v| v["config"]["tapLayers"] = serde_json::json!([1, 40]));
    let e = err_text(load_drafter(&taps, m.config()));
    assert!(e.contains("tap layer 40"), "{e}");
    // A descriptor whose target id names another target than its dims is refused.
    let other_id = copy("other-id", &|v| v["target_id"] = "big@2560x262144".into());
    let e = err_text(load_drafter(&other_id, m.config()));
    assert!(e.contains("big@2560x262144") && e.contains("hidden size 2560"), "{e}");
    let heads = copy("heads", &|v| v["config"]["nHeads"] = 5.into());
    assert!(err_text(load_drafter(&heads, m.config())).contains("not divisible"));
    // A different target (hidden 128 but vocab differs) is refused.
    let mut json = tiny_config_b().to_json_value();
    json["vocab_size"] = 256.into();
    let other = TextConfig::from_json_str(&json.to_string()).unwrap();
    let e = err_text(load_drafter(&good, &other));
    assert!(e.contains("vocabSize 512") && e.contains("vocab_size 256"), "{e}");
    // Mis-shaped and missing tensors.
    let gamma = copy("gamma", &|v| v["config"]["gamma"] = 6.into());
    let e = err_text(load_drafter(&gamma, m.config()));
    assert!(e.contains("mask_emb") && e.contains("[3, 64]") && e.contains("[5, 64]"), "{e}");
    let three = DSparkConfig { n_layers: 3, ..cfg(4, vec![1, 3]) }.param_names();
    let missing = copy("missing", &|v| {
        v["config"]["nLayers"] = 3.into();
        v["param_names"] = serde_json::json!(three);
    });
    let e = err_text(load_drafter(&missing, m.config()));
    assert!(e.contains("missing tensor") && e.contains("bb.2"), "{e}");
    // The descriptor's parameter list must be the config's.
    let names = copy("names", &|v| v["config"]["nLayers"] = 3.into());
    let e = err_text(load_drafter(&names, m.config()));
    assert!(e.contains("param_names") && e.contains("bb.2"), "{e}");
    // A typo in the variant is not mistaken for a v1 checkpoint.
    let typo = copy("typo", &|v| v["variant"] = "dsprak".into());
    let e = err_text(load_drafter(&typo, m.config()));
    assert!(e.contains("unknown variant \"dsprak\"") && !e.contains("v1"), "{e}");
    // A tensor that is no parameter of the config is refused (strict load).
    let extra = copy("extra", &|_| {});
    let mut t = mlx_core::load_safetensors(&extra.join("model.safetensors")).unwrap().tensors;
    t.insert("bb.9.q".into(), Array::zeros(&[4, 4], Dtype::F32).unwrap());
    mlx_core::save_safetensors(
        &extra.join("model.safetensors"),
        t.iter().map(|(n, a)| (n.as_str(), a)),
        &Default::default(),
    )
    .unwrap();
    let e = err_text(load_drafter(&extra, m.config()));
    assert!(e.contains("unexpected tensor \"bb.9.q\""), "{e}");
    // A target model passed as a drafter is pointed the right way.
    let e = err_text(load_drafter(target_dir, m.config()));
    assert!(e.contains("target model") && e.contains("not a drafter"), "{e}");
    let e = err_text(load_drafter(&scratch("nothing-here"), m.config()));
    assert!(e.contains("not a directory"), "{e}");
    assert!(matches!(load_drafter(&v1, m.config()), Err(Error::Checkpoint { .. })));
}

#[test]
fn calibration_is_stored_and_used_for_pruning() {
    use spec_decode::dspark::{write_calibration, Calibration};
    use spec_decode::{speculative_generate, Pruning, SpecConfig};
    let (_, m) = &target();
    let d = DSparkDrafter::init(cfg(4, vec![1, 6]), m.config(), "tiny", 3, true).unwrap();
    let dir = d.save(&scratch("cal"), false).unwrap();
    let cal = Calibration::thresholds_only(vec![0.0, 1.0, 1.0, 1.0], 0.5, 10);
    write_calibration(&dir, &cal, false).unwrap();
    let e = write_calibration(&dir, &cal, false).unwrap_err().to_string();
    assert!(e.contains("already has calibrated thresholds") && e.contains("forced"), "{e}");
    assert!(
        write_calibration(&dir, &Calibration { thresholds: vec![0.0], ..cal.clone() }, true).is_err(),
        "length must be γ"
    );
    let mut loaded = load_drafter(&dir, m.config()).unwrap();
    assert_eq!(loaded.thresholds(), Some(cal.thresholds.clone()));
    // Thresholds of 1.0 past position 0 keep exactly one draft per round.
    let p: Vec<u32> = (4..12).collect();
    let sc = SpecConfig {
        generate: GenerateConfig { max_tokens: 24, ..Default::default() },
        gamma: Some(4),
        pruning: Pruning::Calibrated,
    };
    let out = speculative_generate(m, loaded.as_mut(), &p, &sc, |_| {}).unwrap();
    assert!(out.stats.drafted <= out.stats.rounds, "at most one draft per round: {}", out.stats.summary());
    assert!(out.stats.drafted_by_pos.len() <= 1, "{:?}", out.stats.drafted_by_pos);
    assert!(!out.conf_samples.is_empty() && out.conf_samples.iter().all(|s| s.pos == 0));
    // An uncalibrated drafter cannot use Pruning::Calibrated.
    let mut plain = DSparkDrafter::init(cfg(4, vec![1, 6]), m.config(), "tiny", 3, true).unwrap();
    let e = speculative_generate(m, &mut plain, &p, &sc, |_| {}).unwrap_err().to_string();
    assert!(e.contains("no thresholds of its own"), "{e}");
}

#[test]
fn descriptor_records_the_target_depth_and_is_checked() {
    let (_, m) = &target();
    let d = DSparkDrafter::init(cfg(4, vec![1, 6]), m.config(), "tiny", 3, false).unwrap();
    let good = d.save(&scratch("depth"), false).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(good.join("dspark.json")).unwrap()).unwrap();
    assert_eq!(v["version"], 2);
    assert_eq!(v["dims"]["numLayers"], m.config().num_hidden_layers);
    let edited_dir = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let dir = scratch(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(good.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let mut v = v.clone();
        edit(&mut v);
        std::fs::write(dir.join("dspark.json"), v.to_string()).unwrap();
        dir
    };
    let edited = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> String {
        err_text(load_drafter(&edited_dir(name, edit), m.config()))
    };
    let e = edited("depth-other", &|v| v["dims"]["numLayers"] = 9.into());
    assert!(e.contains("numLayers 9") && e.contains("num_hidden_layers 6"), "{e}");
    let e = edited("depth-missing", &|v| drop(v["dims"].as_object_mut().unwrap().remove("numLayers")));
    assert!(e.contains("dims.numLayers is missing"), "{e}");
    // Version 1 had no depth: a final-norm tap (index == depth) cannot be trusted.
    let e = edited("depth-v1", &|v| {
        v["version"] = 1.into();
        drop(v["dims"].as_object_mut().unwrap().remove("numLayers"));
    });
    assert!(e.contains("version-1") && e.contains("taps index 6"), "{e}");
    let e = edited("version", &|v| v["version"] = 7.into());
    assert!(e.contains("format version 7 is not supported"), "{e}");
    let e = edited("eps", &|v| v["dims"]["eps"] = serde_json::json!(-1e-6));
    assert!(e.contains("dims.eps") && e.contains("> 0"), "{e}");
    // The descriptor says where the head comes from; an own head is refused, not misread.
    assert_eq!(v["head"], "target", "written descriptors record the shared head");
    let e = edited("own-head", &|v| v["head"] = "own".into());
    assert!(e.contains("head is \"own\"") && e.contains("share the target's"), "{e}");
    let old = edited_dir("no-head-field", &|v| drop(v.as_object_mut().unwrap().remove("head")));
    assert!(load_drafter(&old, m.config()).is_ok(), "descriptors without `head` (older ones) still load");

    // Calibration blocks: version 1 (thresholds only, no `version` key) still loads; version 2
    // adds per-mode STS fits, whose temperatures are checked.
    let v1 = serde_json::json!({"thresholds": [0.0, 0.5, 0.5, 0.5], "target": 0.9, "samples": 12});
    let dir = edited_dir("cal-v1", &|v| v["config"]["sts"] = v1.clone());
    let d1 = load_drafter(&dir, m.config()).unwrap();
    assert_eq!(d1.thresholds(), Some(vec![0.0, 0.5, 0.5, 0.5]));
    assert_eq!(d1.sts(true), None, "a version-1 calibration has no temperatures");
    let fit = serde_json::json!({"temperatures": [1.5, 2.0, 2.5, 3.0], "samplingTemperature": 0.0, "rounds": 40,
                                 "eceBefore": [0.1, 0.1, 0.1, 0.1], "eceAfter": [0.01, 0.01, 0.01, 0.01]});
    let mut v2 = v1.clone();
    v2["version"] = 2.into();
    v2["greedy"] = fit.clone();
    let dir = edited_dir("cal-v2", &|v| v["config"]["sts"] = v2.clone());
    let d2 = load_drafter(&dir, m.config()).unwrap();
    assert_eq!(d2.sts(true).map(|s| s.temperatures), Some(vec![1.5, 2.0, 2.5, 3.0]));
    assert_eq!(d2.sts(false), None, "fitted for greedy decoding only");
    let e = edited("cal-v9", &|v| {
        v["config"]["sts"] = v2.clone();
        v["config"]["sts"]["version"] = 9.into();
    });
    assert!(e.contains("config.sts.version 9"), "{e}");
    let e = edited("cal-short", &|v| {
        v["config"]["sts"] = v2.clone();
        v["config"]["sts"]["greedy"]["temperatures"] = serde_json::json!([1.0]);
    });
    assert!(e.contains("config.sts.greedy.temperatures has 1 entries"), "{e}");
    let e = edited("cal-zero", &|v| {
        v["config"]["sts"] = v2.clone();
        v["config"]["sts"]["greedy"]["temperatures"] = serde_json::json!([1.0, 0.0, 1.0, 1.0]);
    });
    assert!(e.contains("positive temperatures"), "{e}");
    // Shifts (absent in temperature-only fits) are read and checked.
    let mut v2s = v2.clone();
    v2s["greedy"]["shifts"] = serde_json::json!([0.5, 1.0, 1.5, 2.0]);
    let dir = edited_dir("cal-shifts", &|v| v["config"]["sts"] = v2s.clone());
    let sts = load_drafter(&dir, m.config()).unwrap().sts(true).unwrap();
    assert_eq!(sts.shifts, vec![0.5, 1.0, 1.5, 2.0]);
    assert_eq!(d2.sts(true).unwrap().shifts, Vec::<f32>::new(), "a temperature-only fit has no shifts");
    let e = edited("cal-shifts-short", &|v| {
        v["config"]["sts"] = v2s.clone();
        v["config"]["sts"]["greedy"]["shifts"] = serde_json::json!([0.5]);
    });
    assert!(e.contains("config.sts.greedy.shifts has 1 entries"), "{e}");
    // Version 3 adds isotonic survival maps, one knot list per position, checked knot by knot.
    let mut v3 = v2s.clone();
    v3["version"] = 3.into();
    let map = serde_json::json!([[0.1, 0.05], [0.5, 0.6], [0.9, 1.0]]);
    v3["greedy"]["survivalMaps"] = serde_json::json!([map, map, map, []]);
    let dir = edited_dir("cal-v3", &|v| v["config"]["sts"] = v3.clone());
    let sts = load_drafter(&dir, m.config()).unwrap().sts(true).unwrap();
    assert_eq!(sts.maps[0].knots, vec![[0.1, 0.05], [0.5, 0.6], [0.9, 1.0]]);
    assert!(sts.maps[3].knots.is_empty(), "an empty list is no map");
    let e = edited("cal-maps-short", &|v| {
        v["config"]["sts"] = v3.clone();
        v["config"]["sts"]["greedy"]["survivalMaps"] = serde_json::json!([map]);
    });
    assert!(e.contains("config.sts.greedy.survivalMaps has 1 entries"), "{e}");
    let e = edited("cal-maps-falling", &|v| {
        v["config"]["sts"] = v3.clone();
        v["config"]["sts"]["greedy"]["survivalMaps"][2] = serde_json::json!([[0.1, 0.5], [0.5, 0.4]]);
    });
    assert!(e.contains("survivalMaps[2]") && e.contains("knot 1"), "{e}");
}

#[test]
fn a_quantized_confidence_head_is_refused() {
    let (_, m) = &target();
    let d = DSparkDrafter::init(cfg(4, vec![1, 3]), m.config(), "tiny", 3, false).unwrap();
    let dir = d.save(&scratch("qconf"), false).unwrap();
    let path = dir.join("model.safetensors");
    let mut t = mlx_core::load_safetensors(&path).unwrap().tensors;
    // conf.w stored as if quantized: .weight/.scales/.biases instead of the dense tensor.
    let w = t.remove("conf.w").unwrap();
    t.insert("conf.w.weight".into(), w.clone());
    t.insert("conf.w.scales".into(), Array::zeros(&[1, 1], Dtype::F32).unwrap());
    t.insert("conf.w.biases".into(), Array::zeros(&[1, 1], Dtype::F32).unwrap());
    mlx_core::save_safetensors(&path, t.iter().map(|(n, a)| (n.as_str(), a)), &Default::default()).unwrap();
    let e = err_text(load_drafter(&dir, m.config()));
    assert!(e.contains("conf.w is quantized") && e.contains("must stay dense"), "{e}");
}

#[test]
fn pruning_needs_a_confidence_head() {
    use spec_decode::oracle::SelfDrafter;
    use spec_decode::{speculative_generate, Pruning, SpecConfig};
    let (_, m) = &target();
    let p: Vec<u32> = (4..12).collect();
    for pruning in [Pruning::MinConf(0.5), Pruning::Calibrated, Pruning::Thresholds(vec![])] {
        let sc =
            SpecConfig { generate: GenerateConfig { max_tokens: 8, ..Default::default() }, gamma: Some(2), pruning };
        let e = speculative_generate(m, &mut SelfDrafter::new(2), &p, &sc, |_| {}).unwrap_err().to_string();
        assert!(e.contains("no confidence head"), "{e}");
    }
}

#[test]
fn stats_exclude_the_last_draft_free_step_and_count_the_stop_token() {
    use spec_decode::oracle::SelfDrafter;
    use spec_decode::{speculative_generate, SpecConfig};
    let (_, m) = &target();
    let p: Vec<u32> = (4..12).collect();
    // The target drafting for itself accepts everything: rounds of γ + 1 tokens.
    let sc = SpecConfig {
        generate: GenerateConfig { max_tokens: 7, ..Default::default() },
        gamma: Some(2),
        ..Default::default()
    };
    let out = speculative_generate(m, &mut SelfDrafter::new(2), &p, &sc, |_| {}).unwrap();
    assert_eq!(out.tokens.len(), 7);
    // 3 + 3 tokens in two full rounds, then one token alone: a plain step, not a round.
    assert_eq!((out.stats.rounds, out.stats.plain_steps), (2, 1), "{}", out.stats.summary());
    assert!((out.stats.tau() - 3.0).abs() < 1e-9, "τ {}", out.stats.tau());
    assert_eq!(out.stats.forwards_saved(), 4);
    // Stop on the 5th token: plain decoding needs 5 forwards (4 emitted + the stop token).
    let stop = out.tokens[4];
    let first = out.tokens.iter().position(|&t| t == stop).unwrap();
    let sc = SpecConfig { generate: GenerateConfig { stop_tokens: vec![stop], ..sc.generate.clone() }, ..sc };
    let out = speculative_generate(m, &mut SelfDrafter::new(2), &p, &sc, |_| {}).unwrap();
    assert_eq!(out.tokens.len(), first);
    assert_eq!(out.stats.stops, 1);
    assert_eq!(out.stats.forwards_saved(), first + 1 - out.stats.target_forwards());
}

#[test]
fn the_throughput_schedule_is_lossless_and_may_skip_drafting() {
    use spec_decode::testing::ScriptedConfidence;
    use spec_decode::{speculative_generate, Pruning, SpecConfig, ThroughputPlan};
    let (_, m) = &target();
    let p: Vec<u32> = (4..12).collect();
    let gen = GenerateConfig { max_tokens: 40, ..Default::default() };
    let plain = gemma4::generate::generate(m, &p, &gen, |_| {}).unwrap().tokens;
    // First confidence 0.4 or 0.8 per round; the second 0.99 or 0.01 by the parity of draft 1.
    let inner = DSparkDrafter::init(cfg(3, vec![1, 6]), m.config(), "tiny", 3, false).unwrap();
    let mut d = ScriptedConfidence::new(inner, vec![0.4, 0.8], Box::new(|t| if t % 2 == 0 { 0.99 } else { 0.01 }), 7);
    let plan = ThroughputPlan::new(spec_decode::sts::Sts::identity(3), vec![1.0, 1.5, 1.6, 1.7]);
    let sc = SpecConfig { generate: gen.clone(), gamma: Some(3), pruning: Pruning::Throughput(plan.clone()) };
    let out = speculative_generate(m, &mut d, &p, &sc, |_| {}).unwrap();
    assert_eq!(out.tokens, plain, "greedy output under the throughput schedule");
    let s = &out.stats;
    // 0.4 never pays for v(2) = 1.5: those rounds are plain steps; 0.8 verifies one or more.
    assert!(s.plain_steps > 1 && s.rounds > 0, "{}", s.summary());
    assert!(s.host_syncs > 0, "the schedule reads the confidences");
    // The draft cap: the first round asks for the block, later ones follow recent windows.
    assert_eq!(d.asked[0], 3);
    assert!(d.asked.iter().all(|&n| (1..=3).contains(&n)), "{:?}", d.asked);
    assert!(d.asked.iter().any(|&n| n < 3), "after plain steps the loop proposes fewer drafts: {:?}", d.asked);

    // Proposing the whole block every round gives the same output.
    d.asked.clear();
    let sc = SpecConfig { generate: gen, gamma: Some(3), pruning: Pruning::Throughput(plan.without_draft_cap()) };
    let out = speculative_generate(m, &mut d, &p, &sc, |_| {}).unwrap();
    assert_eq!(out.tokens, plain, "greedy output without the draft cap");
    // (The last two rounds may ask for less: a request never drafts past max_tokens.)
    let before_end = d.asked.len().saturating_sub(2);
    assert!(d.asked[..before_end].iter().all(|&n| n == 3), "{:?}", d.asked);
}

#[test]
fn a_context_window_reads_only_the_last_rows() {
    let (_, m) = &target();
    let windowed = DSparkConfig { ctx_window: Some(4), ..cfg(4, vec![1, 3, 6]) };
    let mut seeded_all = DSparkDrafter::init(windowed.clone(), m.config(), "tiny", 9, true).unwrap();
    let mut seeded_last = DSparkDrafter::init(windowed, m.config(), "tiny", 9, true).unwrap();
    let mut whole = DSparkDrafter::init(cfg(4, vec![1, 3, 6]), m.config(), "tiny", 9, true).unwrap();
    let ids: Vec<u32> = (30..42).collect();
    let rows = tapped_rows(m, &whole, &ids);
    seeded_all.reset(Some(&rows), 12).unwrap();
    seeded_last.reset(Some(&rows.slice_axis(1, 8, 12).unwrap()), 12).unwrap();
    whole.reset(Some(&rows), 12).unwrap();
    assert_eq!(seeded_last.context_len(), 12, "the rows before the window still count as committed");
    let last = propose_greedy(m, &mut seeded_last, 7, 12);
    assert_eq!(propose_greedy(m, &mut seeded_all, 7, 12), last, "rows before the window are not read");
    assert_ne!(propose_greedy(m, &mut whole, 7, 12).1, last.1, "without the window they are");
    // Commits slide the window: rows 12..14 join, rows 8..10 leave.
    let more = tapped_rows(m, &whole, &(30..44).collect::<Vec<u32>>()).slice_axis(1, 12, 14).unwrap();
    seeded_all.commit(Some(&more), 2).unwrap();
    let mut fresh =
        DSparkDrafter::init(DSparkConfig { ctx_window: Some(4), ..cfg(4, vec![1, 3, 6]) }, m.config(), "tiny", 9, true)
            .unwrap();
    let tail = concatenate(&[&rows.slice_axis(1, 10, 12).unwrap(), &more], 1).unwrap();
    fresh.reset(Some(&tail), 14).unwrap();
    assert_eq!(propose_greedy(m, &mut seeded_all, 7, 14), propose_greedy(m, &mut fresh, 7, 14));
    // Fewer rows than the window (of a long enough context) are refused.
    let e = seeded_last.reset(Some(&rows.slice_axis(1, 9, 12).unwrap()), 12).unwrap_err();
    assert!(e.to_string().contains("4 to 12"), "{e}");
}
