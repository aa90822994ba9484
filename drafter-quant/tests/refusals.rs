//! Every refusal of the quantizer, each with a clear error, and the staging guarantee: a failed
//! run leaves no output directory and no temporary directory behind.

mod common;

use common::*;
use drafter_quant::{Error, Progress, Smoke, SmokeOutcome};
use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::{tiny_config_a, tiny_config_b};
use mlx_core::Dtype;
use spec_decode::testing::SyntheticDeepSpec;

/// Nothing but the source is left in the scratch dir (no output, no `.tmp-` staging dir).
fn assert_nothing_written(s: &Scratch) {
    assert_eq!(s.entries(), vec!["src".to_string()], "a failed run must leave nothing behind");
}

#[test]
fn refuses_a_directory_that_is_not_a_drafter() {
    let s = Scratch::create("not-drafter");
    let src = s.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let e = run(&src, &s.join("q"), &opts(4, 64, Smoke::Off)).0.unwrap_err();
    assert!(matches!(e, Error::NotDrafter { .. }), "{e}");
    assert!(e.to_string().contains("neither dspark.json"), "{e}");
    std::fs::write(src.join("config.json"), r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}"#)
        .unwrap();
    let e = run(&src, &s.join("q"), &opts(4, 64, Smoke::Off)).0.unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::NotDrafter { .. }) && msg.contains("LlamaForCausalLM") && msg.contains("llama"),
        "{msg}"
    );
    assert_nothing_written(&s);
}

#[test]
fn refuses_a_target_model_and_points_to_the_target_quantizer() {
    let s = Scratch::create("target");
    let src = write_random_checkpoint(&s.join("src"), &tiny_config_a(), 0, Dtype::Bf16, 1, true).unwrap();
    let e = run(&src, &s.join("q"), &opts(4, 64, Smoke::Off)).0.unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::TargetModel { .. }), "{msg}");
    assert!(msg.contains("gemma4_text") && msg.contains("dspark quantize-target"), "{msg}");
    assert_nothing_written(&s);
}

#[test]
fn refuses_an_already_quantized_source() {
    let s = Scratch::create("already");
    let ds = write_deepspec(&s.join("ds"), &deepspec_opts());
    let dsp = write_dspark(&s.join("dsp"), dspark_config(64));
    for src in [&ds, &dsp] {
        let q = s.join(format!("{}-q", src.file_name().unwrap().to_string_lossy()));
        run(src, &q, &opts(4, 64, Smoke::Off)).0.unwrap();
        let e = run(&q, &s.join("qq"), &opts(8, 64, Smoke::Off)).0.unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::AlreadyQuantized { .. })
                && msg.contains("quantization")
                && msg.contains("bf16 checkpoint"),
            "{msg}"
        );
    }
    // Packed tensors without a config block are caught too.
    let q = s.join("ds-q");
    let path = q.join("config.json");
    let mut cfg = json(&path);
    let map = cfg.as_object_mut().unwrap();
    map.remove("quantization");
    map.remove("quantization_config");
    std::fs::write(&path, serde_json::to_string(&cfg).unwrap()).unwrap();
    let e = run(&q, &s.join("qq"), &opts(8, 64, Smoke::Off)).0.unwrap_err();
    assert!(matches!(e, Error::AlreadyQuantized { .. }) && e.to_string().contains(".scales"), "{e}");
    assert!(!s.join("qq").exists());
}

#[test]
fn refuses_unsupported_bits_and_group_sizes() {
    let s = Scratch::create("bits");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    for bits in [2, 3, 6, 16] {
        let e = run(&src, &s.join("q"), &opts(bits, 64, Smoke::Off)).0.unwrap_err();
        assert!(matches!(e, Error::UnsupportedBits(b) if b == bits), "{e}");
        assert!(e.to_string().contains("expected 4 or 8"), "{e}");
    }
    for gs in [16, 256] {
        let e = run(&src, &s.join("q"), &opts(4, gs, Smoke::Off)).0.unwrap_err();
        assert!(matches!(e, Error::UnsupportedGroupSize(g) if g == gs), "{e}");
        assert!(e.to_string().contains("expected 32, 64 or 128"), "{e}");
    }
    assert_nothing_written(&s);
}

/// The warnings a run reported.
fn warnings(events: &[Progress]) -> Vec<String> {
    events.iter().filter_map(|p| if let Progress::Warning(w) = p { Some(w.clone()) } else { None }).collect()
}

#[test]
fn a_deepspec_matrix_the_group_size_does_not_divide_falls_back_and_says_so() {
    let s = Scratch::create("div-ds");
    let src = write_deepspec(&s.join("src"), &SyntheticDeepSpec { intermediate_size: 96, ..deepspec_opts() });
    let (r, events) = run(&src, &s.join("q"), &opts(4, 64, Smoke::Auto));
    r.unwrap();
    // down_proj's input axis is 96: group 32 divides it, 64 does not.
    let w = warnings(&events);
    assert!(w.iter().any(|w| w.contains("layers.0.mlp.down_proj.weight") && w.contains("group size 32")), "{w:?}");
    let block = &json(&s.join("q/config.json"))["quantization"];
    assert_eq!(block["group_size"], 64);
    assert_eq!(block["layers.0.mlp.down_proj"]["group_size"], 32, "{block}");
    let t = tensors(&s.join("q"));
    assert_eq!(t["layers.0.mlp.down_proj.scales"].shape().unwrap()[1], 96 / 32);
    // The synthetic default's Markov rank 16 is below every supported group size: kept dense,
    // recorded as such, and said.
    let s = Scratch::create("div-ds-markov");
    let src = write_deepspec(&s.join("src"), &SyntheticDeepSpec::default());
    let (r, events) = run(&src, &s.join("q"), &opts(8, 32, Smoke::Auto));
    r.unwrap();
    let w = warnings(&events);
    assert!(w.iter().any(|w| w.contains("markov_head.markov_w1.weight") && w.contains("kept unquantized")), "{w:?}");
    assert_eq!(json(&s.join("q/config.json"))["quantization"]["markov_head.markov_w1"], false);
    assert!(!tensors(&s.join("q")).contains_key("markov_head.markov_w1.scales"));
}

#[test]
fn a_dspark_drafter_quantizes_at_its_default_group_size_with_overrides() {
    // The project's default drafter has markov.w1 [4096, 32]: the default group 64 used to
    // refuse it. Here a Markov rank of 32 and d = 96 stand in for it.
    let s = Scratch::create("div-dsp");
    let src = write_dspark(&s.join("src"), spec_decode::dspark::DSparkConfig { markov_rank: 32, ..dspark_config(96) });
    let (r, events) = run(&src, &s.join("q"), &opts(4, 64, Smoke::Auto));
    let report = r.unwrap();
    assert!(report.tensors_quantized > 0);
    let w = warnings(&events);
    assert!(w.iter().any(|w| w.contains("markov.w1") && w.contains("group size 32")), "{w:?}");
    assert!(w.iter().any(|w| w.contains("bb.0.gate") && w.contains("group size 32")), "{w:?}");
    let block = &json(&s.join("q/dspark.json"))["quantization"];
    assert_eq!(block["markov.w1"]["group_size"], 32, "{block}");
    assert_eq!(block["conf.w"], false, "{block}");
    // The load smoke (run above) reloaded it; a plain load works too.
    spec_decode::loader::load_drafter(&s.join("q"), &tiny_config_a()).unwrap();
}

#[test]
fn refuses_a_non_empty_output_unless_forced() {
    let s = Scratch::create("nonempty");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    let dst = s.join("q");
    std::fs::create_dir_all(&dst).unwrap();
    std::fs::write(dst.join("stray.txt"), "x").unwrap();
    let e = run(&src, &dst, &opts(4, 64, Smoke::Off)).0.unwrap_err();
    assert!(matches!(e, Error::OutputNotEmpty { .. }) && e.to_string().contains("must be forced"), "{e}");
    assert!(dst.join("stray.txt").is_file(), "a refused run must not touch the output");
    // An empty output directory is fine without --force.
    std::fs::remove_file(dst.join("stray.txt")).unwrap();
    run(&src, &dst, &opts(4, 64, Smoke::Off)).0.unwrap();
    // With force, the directory is replaced wholesale.
    std::fs::write(dst.join("stray.txt"), "x").unwrap();
    let forced = drafter_quant::QuantizeOptions { force: true, ..opts(8, 64, Smoke::Off) };
    run(&src, &dst, &forced).0.unwrap();
    assert!(!dst.join("stray.txt").exists());
    assert_eq!(json(&dst.join("config.json"))["quantization"]["bits"], 8);
    assert_eq!(s.entries(), vec!["q".to_string(), "src".to_string()]);
}

#[test]
fn refuses_to_replace_the_source() {
    let s = Scratch::create("same");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    let forced = drafter_quant::QuantizeOptions { force: true, ..opts(4, 64, Smoke::Off) };
    for dst in [src.clone(), s.0.clone(), src.join(".")] {
        let e = run(&src, &dst, &forced).0.unwrap_err();
        assert!(matches!(e, Error::OutputIsSource { .. }), "{}: {e}", dst.display());
    }
    assert!(src.join("config.json").is_file());
}

#[test]
fn a_failed_smoke_leaves_nothing_behind() {
    let s = Scratch::create("smoke-fail");
    let src = write_deepspec(&s.join("src"), &deepspec_opts());
    let wrong = write_random_checkpoint(&s.join("wrong-target"), &tiny_config_b(), 0, Dtype::Bf16, 1, true).unwrap();
    let e = run(&src, &s.join("q"), &opts(4, 64, Smoke::Target(wrong))).0.unwrap_err();
    let msg = format!("{e}: {}", std::error::Error::source(&e).map(|c| c.to_string()).unwrap_or_default());
    assert!(
        matches!(e, Error::Smoke { stage: "reloading the drafter", .. }) && msg.contains("6-layer target"),
        "{msg}"
    );
    assert_eq!(s.entries(), vec!["src".to_string(), "wrong-target".to_string()]);
}

#[test]
fn smoke_reloads_and_projects_context_for_another_target_and_drafts_on_a_given_one() {
    let s = Scratch::create("smoke-b");
    let b = tiny_config_b();
    let src = spec_decode::testing::write_synthetic_deepspec(
        &s.join("src"),
        &b,
        &SyntheticDeepSpec { target_layer_ids: vec![1, 2, 3], ..deepspec_opts() },
    )
    .unwrap();
    let (r, events) = run(&src, &s.join("q"), &opts(4, 64, Smoke::Auto));
    let r = r.unwrap();
    assert!(
        matches!(&r.smoke, SmokeOutcome::ContextOnly { reason } if reason.contains("projected one context row") && reason.contains("smoke target")),
        "{:?}",
        r.smoke
    );
    assert!(events.iter().any(|e| matches!(e, Progress::Warning(w) if w.contains("load smoke: reloaded"))));
    // f32: MLX's CPU GatherMM (config B is MoE) only runs in float32.
    let target = write_random_checkpoint(&s.join("target-b"), &b, 0, Dtype::F32, 1, true).unwrap();
    let forced = drafter_quant::QuantizeOptions { force: true, ..opts(4, 64, Smoke::Target(target.clone())) };
    let r = run(&src, &s.join("q"), &forced).0.unwrap();
    assert!(matches!(&r.smoke, SmokeOutcome::Passed { drafts: 5, .. }), "{:?}", r.smoke);
    let off = run(&src, &s.join("q"), &drafter_quant::QuantizeOptions { smoke: Smoke::Off, ..forced }).0.unwrap();
    assert!(matches!(&off.smoke, SmokeOutcome::Skipped { .. }));
}
