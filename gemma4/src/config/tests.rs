use super::fixtures::{tiny_config_a_json, tiny_config_b_json};
use super::*;
use serde_json::{json, Value};
use std::path::PathBuf;

use LayerKind::{Full, Sliding};

fn parse(v: &Value) -> Result<TextConfig, ConfigError> {
    TextConfig::from_json_str(&v.to_string())
}

/// `base` with `patch`'s keys replaced (a `null` patch value removes the key).
fn with(base: &Value, patch: Value) -> Value {
    let mut out = base.clone();
    if let (Value::Object(o), Value::Object(p)) = (&mut out, patch) {
        for (k, v) in p {
            match v {
                Value::Null => o.remove(&k),
                v => o.insert(k, v),
            };
        }
    }
    out
}

fn err_text(v: &Value) -> String {
    match parse(v) {
        Ok(cfg) => panic!("expected an error, parsed {cfg:?}"),
        Err(e) => e.to_string(),
    }
}

/// Wraps flat decoder fields as `model_type: gemma4` with the top-level vocab and eos.
fn nested(flat: &Value) -> Value {
    let mut text = flat.clone();
    if let Value::Object(o) = &mut text {
        o.remove("model_type");
    }
    let vocab = flat["vocab_size"].clone();
    let eos = json!([1, 106]);
    json!({"model_type": "gemma4", "text_config": text, "vocab_size": vocab, "eos_token_id": eos})
}

fn kinds_for(n: usize, pattern: usize) -> Vec<&'static str> {
    (0..n).map(|i| if i % pattern == pattern - 1 { "full_attention" } else { "sliding_attention" }).collect()
}

/// E2B values, written out explicitly.
fn e2b_json() -> Value {
    json!({
        "model_type": "gemma4_text", "hidden_size": 1536, "num_hidden_layers": 35,
        "intermediate_size": 6144, "num_attention_heads": 8, "num_key_value_heads": 1,
        "num_global_key_value_heads": null, "attention_k_eq_v": false, "head_dim": 256,
        "global_head_dim": 512, "sliding_window": 512, "num_kv_shared_layers": 20,
        "hidden_size_per_layer_input": 256, "vocab_size_per_layer_input": 262144,
        "use_double_wide_mlp": true, "final_logit_softcapping": 30.0, "vocab_size": 262144,
        "layer_types": kinds_for(35, 5),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention":
                {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
    })
}

fn e4b_json() -> Value {
    with(
        &e2b_json(),
        json!({
            "hidden_size": 2560, "num_hidden_layers": 42, "intermediate_size": 10240,
            "num_key_value_heads": 2, "num_kv_shared_layers": 18, "use_double_wide_mlp": false,
            "layer_types": kinds_for(42, 6),
        }),
    )
}

/// 12B (gemma4_unified, nested, k_eq_v).
fn b12_json() -> Value {
    let text = with(
        &e2b_json(),
        json!({
            "hidden_size": 3840, "num_hidden_layers": 48, "intermediate_size": 15360,
            "num_attention_heads": 16, "num_key_value_heads": 8, "num_global_key_value_heads": 1,
            "attention_k_eq_v": true, "sliding_window": 1024, "num_kv_shared_layers": 0,
            "hidden_size_per_layer_input": 0, "use_double_wide_mlp": false,
            "layer_types": kinds_for(48, 6),
        }),
    );
    json!({"model_type": "gemma4_unified", "text_config": text, "vocab_size": 262144})
}

#[test]
fn tiny_config_a_derives_donors_widths_and_partial_rope() {
    let a = tiny_config_a();
    assert_eq!(a.layout, Layout::Flat);
    assert_eq!(a.first_kv_shared, 3);
    assert_eq!(a.num_caches(), 3);
    assert!(a.has_ple());
    let kinds: Vec<_> = a.layers.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [Sliding, Sliding, Full, Sliding, Sliding, Full]);
    let kv: Vec<_> = a.layers.iter().map(|l| l.kv).collect();
    assert_eq!(
        kv,
        [
            KvSource::Own { cache_index: 0 },
            KvSource::Own { cache_index: 1 },
            KvSource::Own { cache_index: 2 },
            KvSource::Shared { donor: 1 },
            KvSource::Shared { donor: 1 },
            KvSource::Shared { donor: 2 },
        ]
    );
    let widths: Vec<_> = a.layers.iter().map(|l| l.mlp_width).collect();
    assert_eq!(widths, [128, 128, 128, 256, 256, 256]);
    assert_eq!((a.layer(2).head_dim, a.layer(2).rotary_dims), (64, 16));
    assert_eq!((a.layer(0).head_dim, a.layer(0).rotary_dims), (32, 32));
    assert_eq!(
        a.layer(2).rope,
        RopeSpec { rope_type: RopeType::Proportional, theta: 1e6, partial_rotary_factor: 0.25, factor: 1.0 }
    );
    assert_eq!(a.layer(0).rope.rope_type, RopeType::Default);
    assert!(a.layers.iter().all(|l| l.has_v_proj && l.n_kv_heads == 2 && l.n_heads == 4));
    assert_eq!((a.eos_token_ids.as_slice(), a.bos_token_id, a.pad_token_id), (&[1][..], 2, 0));
}

#[test]
fn tiny_config_b_has_moe_and_no_v_proj_on_full_layers() {
    let b = tiny_config_b();
    assert_eq!((b.num_experts, b.top_k_experts, b.moe_intermediate_size), (Some(4), Some(2), Some(64)));
    assert!(b.enable_moe_block && !b.has_ple());
    assert_eq!(b.num_caches(), 4);
    for l in &b.layers {
        assert_eq!(l.has_v_proj, l.kind == Sliding);
        assert_eq!(l.n_kv_heads, if l.kind == Full { 1 } else { 2 });
        assert_eq!(l.mlp_width, 128);
    }
}

#[test]
fn flat_and_nested_layouts_give_the_same_layers() {
    let flat = tiny_config_a();
    let nest = parse(&nested(&tiny_config_a_json())).unwrap();
    assert_eq!(nest.layout, Layout::Nested);
    assert_eq!(nest.layers, flat.layers);
    assert_eq!(nest.eos_token_ids, [1, 106]);
    assert_eq!(TextConfig { layout: Layout::Flat, eos_token_ids: vec![1], ..nest }, flat);
    let unified = with(&nested(&tiny_config_a_json()), json!({"model_type": "gemma4_unified"}));
    assert_eq!(parse(&unified).unwrap().layers, flat.layers);
}

#[test]
fn nested_top_level_vocab_size_overrides_text_config() {
    let mut v = nested(&tiny_config_a_json());
    v["text_config"]["vocab_size"] = json!(999);
    assert_eq!(parse(&v).unwrap().vocab_size, 512);
    let mut without = with(&v, json!({"vocab_size": null}));
    without["text_config"]["vocab_size_per_layer_input"] = json!(262144); // the PLE table must cover it
    assert_eq!(parse(&without).unwrap().vocab_size, 262144);
}

#[test]
fn nested_heads_default_to_8_and_1() {
    let mut v = nested(&tiny_config_a_json());
    if let Value::Object(t) = &mut v["text_config"] {
        t.remove("num_attention_heads");
        t.remove("num_key_value_heads");
    }
    let cfg = parse(&v).unwrap();
    assert_eq!((cfg.num_attention_heads, cfg.num_key_value_heads), (8, 1));
}

#[test]
fn e2b_shares_kv_from_13_and_14_with_double_wide_mlp() {
    let cfg = parse(&e2b_json()).unwrap();
    assert_eq!(cfg.first_kv_shared, 15);
    assert_eq!(cfg.num_caches(), 15);
    for (i, l) in cfg.layers.iter().enumerate() {
        assert_eq!(l.kind == Full, i % 5 == 4, "layer {i}");
        let expect_kv = match (i < 15, l.kind) {
            (true, _) => KvSource::Own { cache_index: i },
            (false, Sliding) => KvSource::Shared { donor: 13 },
            (false, Full) => KvSource::Shared { donor: 14 },
        };
        assert_eq!(l.kv, expect_kv, "layer {i}");
        assert_eq!(l.mlp_width, if i >= 15 { 12288 } else { 6144 }, "layer {i}");
        let (dim, rot) = if l.kind == Full { (512, 128) } else { (256, 256) };
        assert_eq!((l.head_dim, l.rotary_dims), (dim, rot), "layer {i}");
    }
}

#[test]
fn absent_fields_default_to_e2b() {
    let defaults = parse(&json!({"model_type": "gemma4_text"})).unwrap();
    let e2b = parse(&e2b_json()).unwrap();
    assert_eq!(defaults, e2b);
    assert_eq!(defaults.final_logit_softcapping, Some(30.0));
    assert_eq!(defaults.max_position_embeddings, 131072);
}

#[test]
fn e4b_donors_are_22_and_23() {
    let cfg = parse(&e4b_json()).unwrap();
    assert_eq!(cfg.first_kv_shared, 24);
    for l in &cfg.layers[24..] {
        let donor = if l.kind == Full { 23 } else { 22 };
        assert_eq!(l.kv, KvSource::Shared { donor });
        assert_eq!(l.mlp_width, 10240);
    }
}

#[test]
fn k_eq_v_full_layers_use_global_kv_heads_and_no_v_proj() {
    let cfg = parse(&b12_json()).unwrap();
    assert_eq!(cfg.layout, Layout::Nested);
    assert_eq!(cfg.num_caches(), 48);
    for l in &cfg.layers {
        match l.kind {
            Full => assert!(!l.has_v_proj && l.n_kv_heads == 1 && l.head_dim == 512),
            Sliding => assert!(l.has_v_proj && l.n_kv_heads == 8 && l.head_dim == 256),
        }
    }
}

#[test]
fn layer_types_default_to_repeated_pattern_without_forcing_last_full() {
    let v = with(
        &tiny_config_a_json(),
        json!({"layer_types": null, "num_hidden_layers": 7, "num_kv_shared_layers": 0,
               "_sliding_window_pattern": 3}),
    );
    let kinds: Vec<_> = parse(&v).unwrap().layers.iter().map(|l| l.kind).collect();
    assert_eq!(kinds, [Sliding, Sliding, Full, Sliding, Sliding, Full, Sliding]);
}

#[test]
fn null_ple_and_null_softcap_disable_them() {
    let v = with(&tiny_config_a_json(), json!({}));
    let mut v = v;
    v["hidden_size_per_layer_input"] = Value::Null;
    v["final_logit_softcapping"] = Value::Null;
    let cfg = parse(&v).unwrap();
    assert!(!cfg.has_ple());
    assert_eq!(cfg.final_logit_softcapping, None);
}

#[test]
fn untied_embeddings_are_recorded() {
    let cfg = parse(&with(&tiny_config_a_json(), json!({"tie_word_embeddings": false}))).unwrap();
    assert!(!cfg.tie_word_embeddings);
}

#[test]
fn layer_types_error_names_index_and_expected_values() {
    let mut v = tiny_config_a_json();
    v["layer_types"][3] = json!("foo");
    assert_eq!(err_text(&v), r#"layer_types[3]: expected "sliding_attention" or "full_attention", got "foo""#);
    let nest = nested(&v);
    assert!(err_text(&nest).starts_with("text_config.layer_types[3]: "));
}

#[test]
fn each_validation_error_names_its_field() {
    let a = tiny_config_a_json();
    let b = tiny_config_b_json();
    let rope = |sliding: Value, full: Value| {
        with(&a, json!({"rope_parameters": {"sliding_attention": sliding, "full_attention": full}}))
    };
    let partial = |x: f64| json!({"rope_type": "proportional", "partial_rotary_factor": x});
    let (s, f) = ("sliding_attention", "full_attention");
    let cases: Vec<(Value, &str)> = vec![
        (with(&a, json!({"num_hidden_layers": 0})), "num_hidden_layers"),
        (with(&a, json!({"num_hidden_layers": 5})), "layer_types"),
        (with(&a, json!({"hidden_size": 0})), "hidden_size"),
        (with(&a, json!({"intermediate_size": 0})), "intermediate_size"),
        (with(&a, json!({"num_attention_heads": 0})), "num_attention_heads"),
        (with(&a, json!({"num_key_value_heads": 0})), "num_key_value_heads"),
        (with(&a, json!({"head_dim": 0})), "head_dim"),
        (with(&a, json!({"global_head_dim": 0})), "global_head_dim"),
        (with(&a, json!({"num_key_value_heads": 3})), "num_key_value_heads"),
        (with(&b, json!({"num_global_key_value_heads": 3})), "num_global_key_value_heads"),
        (with(&a, json!({"num_kv_shared_layers": 6})), "num_kv_shared_layers"),
        (with(&b, json!({"num_experts": null})), "num_experts"),
        (with(&b, json!({"top_k_experts": null})), "top_k_experts"),
        (with(&b, json!({"moe_intermediate_size": null})), "moe_intermediate_size"),
        (with(&b, json!({"top_k_experts": 5})), "top_k_experts"),
        (with(&a, json!({"vocab_size_per_layer_input": 0})), "vocab_size_per_layer_input"),
        (
            with(&a, json!({"vocab_size_per_layer_input": 256})),
            "vocab_size_per_layer_input: expected a value >= vocab_size (512)",
        ),
        (with(&a, json!({"final_logit_softcapping": 0.0})), "final_logit_softcapping"),
        (with(&a, json!({"final_logit_softcapping": -1.0})), "final_logit_softcapping"),
        (with(&a, json!({"sliding_window": 0})), "sliding_window"),
        (with(&a, json!({"rms_norm_eps": 0.0})), "rms_norm_eps"),
        (with(&a, json!({"vocab_size": 0})), "vocab_size"),
        (with(&a, json!({"rope_parameters": {"sliding_attention": {}}})), "rope_parameters.full_attention"),
        (
            rope(json!({"rope_type": "yarn"}), json!({})),
            r#"sliding_attention.rope_type: expected "default" or "proportional", got "yarn""#,
        ),
        (rope(json!({}), partial(0.3)), "rope_parameters.full_attention.partial_rotary_factor"),
        (rope(json!({}), partial(1.5)), "rope_parameters.full_attention.partial_rotary_factor"),
        // Layer 1 is sliding but the only donor (layer 0) is full.
        (with(&a, json!({"layer_types": [f, s, s, s, s, s], "num_kv_shared_layers": 5})), "num_kv_shared_layers"),
        (
            with(&a, json!({"model_type": "llama"})),
            r#"model_type: expected "gemma4_text", "gemma4" or "gemma4_unified", got "llama""#,
        ),
        (with(&a, json!({"model_type": null})), "model_type"),
    ];
    for (v, field) in cases {
        let msg = err_text(&v);
        assert!(msg.contains(field), "error {msg:?} should mention {field:?}");
    }
}

#[test]
fn type_errors_name_the_field_and_syntax_errors_give_line_and_column() {
    let v = with(&tiny_config_a_json(), json!({"hidden_size": "big"}));
    assert!(err_text(&v).starts_with("hidden_size: invalid type"), "{}", err_text(&v));
    let mut n = nested(&tiny_config_a_json());
    n["text_config"]["sliding_window"] = json!(-4);
    assert!(err_text(&n).starts_with("text_config.sliding_window: "), "{}", err_text(&n));
    let bad_eos = with(&tiny_config_a_json(), json!({"eos_token_id": "x"}));
    assert!(err_text(&bad_eos).starts_with("eos_token_id: "));
    let e = TextConfig::from_json_str("{\n  \"model_type\": \"gemma4_text\",\n  \"hidden_size\": 12,,\n}").unwrap_err();
    assert!(matches!(e, ConfigError::Json { .. }));
    assert!(e.to_string().contains("line 3 column"), "{e}");
}

#[test]
fn quantization_block_gives_default_overrides_and_unquantized_entries() {
    let q = json!({
        "group_size": 64, "bits": 4, "mode": "affine",
        "model.layers.0.router.proj": {"group_size": 64, "bits": 8},
        "model.embed_tokens_per_layer": false,
        "model.layers.1.mlp.up_proj": true,
    });
    let cfg = parse(&with(&tiny_config_a_json(), json!({"quantization": q}))).unwrap();
    let quant = cfg.quantization.as_ref().unwrap();
    let four = QuantSpec::new(4, 64).unwrap();
    assert_eq!(quant.default, Some(four));
    assert_eq!(quant.spec_for("model.layers.0.router.proj"), Some(QuantSpec::new(8, 64).unwrap()));
    assert_eq!(quant.spec_for("model.embed_tokens_per_layer"), None);
    assert_eq!(quant.spec_for("model.layers.1.mlp.up_proj"), Some(four));
    assert_eq!(quant.spec_for("model.layers.3.self_attn.q_proj"), Some(four));
    assert_eq!(quant.overrides.len(), 3);
}

#[test]
fn quantization_falls_back_to_quantization_config_blocks() {
    let q = json!({"group_size": 32, "bits": 8});
    let spec = Some(QuantSpec::new(8, 32).unwrap());
    let flat = parse(&with(&tiny_config_a_json(), json!({"quantization_config": q}))).unwrap();
    assert_eq!(flat.quantization.unwrap().default, spec);
    let mut n = nested(&tiny_config_a_json());
    n["text_config"]["quantization_config"] = q;
    assert_eq!(parse(&n).unwrap().quantization.unwrap().default, spec);
    assert_eq!(tiny_config_a().quantization, None);
}

#[test]
fn unsupported_quant_modes_and_bad_bits_are_refused_by_key() {
    let a = tiny_config_a_json();
    let cases = [
        (
            json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}),
            "quantization.mode: quantization mode \"mxfp4\" is not supported",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 4,
                                    "m.x": {"group_size": 16, "bits": 4, "mode": "nvfp4"}}}),
            "quantization.m.x.mode: quantization mode \"nvfp4\"",
        ),
        (
            json!({"quantization": {"group_size": 64, "bits": 7}}),
            "quantization.bits: expected one of [2, 3, 4, 5, 6, 8], got 7",
        ),
        (json!({"quantization": {"group_size": 16, "bits": 4}}), "quantization.group_size"),
        (json!({"quantization": {"group_size": 64, "bits": 4, "m.y": {"group_size": 64}}}), "quantization.m.y.bits"),
        (json!({"quantization": {"m.z": true}}), "quantization.m.z"),
        (json!({"quantization": {"group_size": 64, "bits": 4, "m.w": 3}}), "quantization.m.w"),
        (
            json!({"quantization_config": {"quant_method": "mxfp8"}}),
            "quantization_config.quant_method: quantization mode \"mxfp8\"",
        ),
    ];
    for (patch, want) in cases {
        let msg = err_text(&with(&a, patch));
        assert!(msg.contains(want), "error {msg:?} should contain {want:?}");
    }
}

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("gemma4-config-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn generation_config_eos_overrides_stop_ids() {
    let dir = TempDir::new("eos");
    std::fs::write(dir.0.join("config.json"), nested(&tiny_config_a_json()).to_string()).unwrap();
    assert_eq!(TextConfig::from_dir(&dir.0).unwrap().eos_token_ids, [1, 106]);
    std::fs::write(dir.0.join("generation_config.json"), r#"{"eos_token_id": [1, 106, 50], "top_k": 64}"#).unwrap();
    assert_eq!(TextConfig::from_dir(&dir.0).unwrap().eos_token_ids, [1, 106, 50]);
    // Falsy values do not override, as in mlx-lm's load_config.
    std::fs::write(dir.0.join("generation_config.json"), r#"{"eos_token_id": 0}"#).unwrap();
    assert_eq!(TextConfig::from_dir(&dir.0).unwrap().eos_token_ids, [1, 106]);
    std::fs::write(dir.0.join("generation_config.json"), r#"{"eos_token_id": 106}"#).unwrap();
    assert_eq!(TextConfig::from_dir(&dir.0).unwrap().eos_token_ids, [106]);
}

#[test]
fn from_dir_errors_name_the_file() {
    let dir = TempDir::new("err");
    let missing = TextConfig::from_dir(&dir.0).unwrap_err().to_string();
    assert!(missing.contains("config.json"), "{missing}");
    let mut v = tiny_config_a_json();
    v["layer_types"][3] = json!("foo");
    std::fs::write(dir.0.join("config.json"), v.to_string()).unwrap();
    let msg = TextConfig::from_dir(&dir.0).unwrap_err().to_string();
    let path = dir.0.join("config.json");
    assert!(msg.starts_with(&format!("{}: layer_types[3]: ", path.display())), "{msg}");
    std::fs::write(dir.0.join("config.json"), "{").unwrap();
    let msg = TextConfig::from_dir(&dir.0).unwrap_err().to_string();
    assert!(msg.contains("config.json") && msg.contains("line 1"), "{msg}");
}

#[test]
fn to_json_value_round_trips() {
    let q = json!({"group_size": 64, "bits": 4, "model.x": false,
                   "model.layers.0.router.proj": {"group_size": 64, "bits": 8}});
    let quantized = parse(&with(&tiny_config_b_json(), json!({"quantization": q}))).unwrap();
    let untied =
        parse(&with(&tiny_config_a_json(), json!({"tie_word_embeddings": false, "final_logit_softcapping": null})))
            .unwrap();
    let e2b = parse(&json!({"model_type": "gemma4_text"})).unwrap();
    for cfg in [tiny_config_a(), tiny_config_b(), quantized, untied, e2b, parse(&e4b_json()).unwrap()] {
        let v = cfg.to_json_value();
        assert_eq!(v["rms_norm_eps"], json!(1e-6));
        assert_eq!(parse(&v).unwrap(), cfg);
    }
    let nested_12b = parse(&b12_json()).unwrap();
    assert_eq!(parse(&nested_12b.to_json_value()).unwrap(), TextConfig { layout: Layout::Flat, ..nested_12b });
}

#[test]
fn tiny_dense_config_has_the_asked_dims_and_no_extras() {
    let c = tiny_dense_config(256, 16, 3).unwrap();
    assert_eq!((c.hidden_size, c.vocab_size, c.num_hidden_layers), (256, 16, 3));
    assert_eq!(c.layers.iter().map(|l| l.kind).collect::<Vec<_>>(), vec![Sliding, Sliding, Full]);
    assert!(!c.has_ple() && !c.enable_moe_block && c.num_caches() == 3, "no PLE, MoE or KV sharing");
    assert!(tiny_dense_config(0, 16, 2).unwrap_err().to_string().contains("hidden_size"));
}

#[test]
fn integers_that_become_shapes_must_fit_i32() {
    // 2^32 + 128 used to narrow to 128 and load.
    let huge = (1u64 << 32) + 128;
    for field in ["hidden_size", "intermediate_size", "head_dim", "vocab_size", "num_attention_heads"] {
        let msg = err_text(&with(&tiny_config_a_json(), json!({ field: huge })));
        assert!(msg.starts_with(&format!("{field}: expected at most 2147483647")), "{field}: {msg}");
        assert!(msg.contains(&huge.to_string()), "{msg}");
    }
    // Products that are tensor dims: heads × head_dim, layers × PLE width, vocab × hidden.
    let heads = with(
        &tiny_config_a_json(),
        json!({"num_attention_heads": 1 << 20, "num_key_value_heads": 1 << 20, "head_dim": 4096}),
    );
    let msg = err_text(&heads);
    assert!(msg.starts_with("num_attention_heads × head_dim: expected a product of at most 2147483647"), "{msg}");
    let ple = with(&tiny_config_a_json(), json!({"hidden_size_per_layer_input": 1 << 30}));
    assert!(err_text(&ple).starts_with("num_hidden_layers × hidden_size_per_layer_input: "), "{}", err_text(&ple));
    let vh = with(
        &tiny_config_a_json(),
        json!({"vocab_size": 1 << 24, "vocab_size_per_layer_input": 1 << 24, "hidden_size": 1024}),
    );
    assert!(err_text(&vh).starts_with("vocab_size × hidden_size: "), "{}", err_text(&vh));
    let wide = with(&tiny_config_a_json(), json!({"intermediate_size": 1u64 << 30}));
    assert!(err_text(&wide).starts_with("intermediate_size × 2 (use_double_wide_mlp): "), "{}", err_text(&wide));
    let pos = with(&tiny_config_a_json(), json!({"max_position_embeddings": 1u64 << 40}));
    assert!(err_text(&pos).starts_with("max_position_embeddings: expected at most"), "{}", err_text(&pos));
}

#[test]
fn stop_ids_must_be_in_the_vocabulary() {
    for (eos, got) in [(json!(512), "[512]"), (json!([1, 9999]), "id 9999")] {
        let mut v = tiny_config_a_json();
        v["eos_token_id"] = eos.clone();
        let msg = err_text(&v);
        assert!(msg.starts_with("eos_token_id: expected token ids below vocab_size (512)"), "{eos}: {msg}");
        assert!(msg.contains(got), "{eos}: {msg}");
    }
    // An explicit null or [] names no stop ids (the tokenizer's eos then applies); an absent
    // key takes Gemma's default.
    for eos in [json!([]), Value::Null] {
        let mut v = tiny_config_a_json();
        v["eos_token_id"] = eos;
        assert_eq!(parse(&v).unwrap().eos_token_ids, Vec::<u32>::new());
    }
    // Nested, with no top-level list: text_config's is used, and named.
    let mut v = nested(&with(&tiny_config_a_json(), json!({"eos_token_id": 700})));
    v.as_object_mut().unwrap().remove("eos_token_id");
    assert!(err_text(&v).starts_with("text_config.eos_token_id: expected"), "{}", err_text(&v));
}

#[test]
fn generation_config_stop_ids_are_checked_and_name_the_file() {
    let dir = TempDir::new("gen-eos");
    std::fs::write(dir.0.join("config.json"), tiny_config_a_json().to_string()).unwrap();
    let path = dir.0.join("generation_config.json");
    for (text, got) in [(r#"{"eos_token_id": 600}"#, "600"), (r#"{"eos_token_id": false}"#, "false")] {
        std::fs::write(&path, text).unwrap();
        let msg = TextConfig::from_dir(&dir.0).unwrap_err().to_string();
        assert!(msg.starts_with(&format!("{}: eos_token_id: expected", path.display())), "{text}: {msg}");
        assert!(msg.contains(got), "{text}: {msg}");
    }
    // Falsy values do not override config.json's ids, as in mlx-lm.
    for text in [r#"{"eos_token_id": []}"#, r#"{"eos_token_id": null}"#, r#"{"eos_token_id": 0}"#] {
        std::fs::write(&path, text).unwrap();
        assert_eq!(TextConfig::from_dir(&dir.0).unwrap().eos_token_ids, [1], "{text}");
    }
}

#[test]
fn a_config_that_is_not_an_object_says_so() {
    for (text, got) in [("[1, 2]", "an array"), ("\"x\"", "a string"), ("7", "a number")] {
        let msg = TextConfig::from_json_str(text).unwrap_err().to_string();
        assert_eq!(msg, format!("config: expected a JSON object, got {got}"));
    }
}

#[test]
fn bos_and_pad_ids_past_the_vocabulary_are_refused() {
    let v = with(&tiny_config_a_json(), json!({"bos_token_id": 999_999}));
    let e = err_text(&v);
    assert!(e.starts_with("bos_token_id: ") && e.contains("below vocab_size"), "{e}");
    let mut n = nested(&tiny_config_a_json());
    n["text_config"]["pad_token_id"] = json!(999_999);
    let e = err_text(&n);
    assert!(e.starts_with("text_config.pad_token_id: "), "{e}");
    assert_eq!(parse(&with(&tiny_config_a_json(), json!({"bos_token_id": 3}))).unwrap().bos_token_id, 3);
}
