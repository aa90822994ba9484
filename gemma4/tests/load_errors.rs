//! Damaged checkpoints are refused with errors that name the file or tensor and say what was
//! expected. Each test copies a freshly written tiny checkpoint (config A, bf16, one shard plus
//! index) into its own scratch directory, damages the copy, and loads it.
//! Scratch directories come from `common` and are removed after use.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::{copy_of, root, Scratch};

use gemma4::checkpoint::{quantize_checkpoint, write_hf_layout, write_random_checkpoint};
use gemma4::config::{tiny_config_a, ConfigError};
use gemma4::{Error, Model};
use mlx_core::{load_safetensors, save_safetensors, Array, Dtype};
use serde_json::Value;

const SHARD: &str = "model.safetensors";

/// The undamaged source checkpoint (one shard).
fn base() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        write_random_checkpoint(&root().join("base"), &tiny_config_a(), 7, Dtype::Bf16, 1, true).unwrap()
    })
}

/// The base quantized to 4 bits, group 64.
fn base_q4() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| quantize_checkpoint(base(), &root().join("base-q4"), 4, 64, true).unwrap())
}

/// Rewrites one shard after `edit` changed its tensors (metadata kept).
fn edit_shard(dir: &Path, shard: &str, edit: impl FnOnce(&mut BTreeMap<String, Array>)) {
    let path = dir.join(shard);
    let mut file = load_safetensors(&path).unwrap();
    edit(&mut file.tensors);
    let items: Vec<(&str, &Array)> = file.tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    save_safetensors(&path, items, &file.metadata).unwrap();
}

/// Rewrites `model.safetensors.index.json`'s weight map with `edit`.
fn edit_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let index = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    edit(v["weight_map"].as_object_mut().unwrap());
    std::fs::write(&index, serde_json::to_string(&v).unwrap()).unwrap();
}

/// Rewrites a shard's safetensors header with `edit` (the data bytes stay as they are).
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let b = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    edit(header.as_object_mut().unwrap());
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend(&b[8 + n..]);
    std::fs::write(path, out).unwrap();
}

fn load_err(dir: &Path) -> Error {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded, expected an error", dir.display()),
        Err(e) => e,
    }
}

fn assert_mentions(e: &Error, needles: &[&str]) {
    let msg = e.to_string();
    eprintln!("{msg}");
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
}

fn dir_str(dir: &Path) -> String {
    dir.display().to_string()
}

#[test]
fn undamaged_copy_loads() {
    let dir = copy_of(base(), "ok");
    Model::load(&dir).unwrap();
    Model::load(base_q4()).unwrap();
}

#[test]
fn missing_tensor_is_named() {
    for (i, name) in ["layers.1.self_attn.q_proj.weight", "layers.4.layer_scalar", "norm.weight"].iter().enumerate() {
        let dir = copy_of(base(), &format!("missing-{i}"));
        edit_shard(&dir, SHARD, |t| {
            assert!(t.remove(&format!("model.{name}")).is_some(), "fixture lacks {name}");
        });
        edit_index(&dir, |m| {
            m.remove(&format!("model.{name}"));
        });
        let e = load_err(&dir);
        assert!(matches!(&e, Error::MissingWeight { name: n, .. } if n == name), "{e:?}");
        assert_mentions(&e, &[name, "missing tensor", &dir_str(&dir)]);
    }
}

#[test]
fn misshaped_tensor_names_both_shapes() {
    let cases = [("layers.0.mlp.gate_proj.weight", true), ("layers.2.self_attn.q_norm.weight", false)];
    for (i, (name, matrix)) in cases.iter().enumerate() {
        let dir = copy_of(base(), &format!("shape-{i}"));
        let mut shapes = (Vec::new(), Vec::new());
        edit_shard(&dir, SHARD, |t| {
            let key = format!("model.{name}");
            let orig = t[&key].shape().unwrap();
            let bad: Vec<i32> = if *matrix { vec![orig[0], orig[1] / 2] } else { vec![orig[0] + 1] };
            t.insert(key, Array::zeros(&bad, Dtype::Bf16).unwrap());
            shapes = (orig, bad);
        });
        let (want, got) = shapes;
        let e = load_err(&dir);
        assert!(
            matches!(&e, Error::WeightShape { name: n, expected, got: g, .. } if n == name && *expected == want && *g == got),
            "{e:?}"
        );
        assert_mentions(&e, &[name, &format!("{got:?}"), &format!("expected {want:?}"), &dir_str(&dir)]);
    }
}

#[test]
fn extra_tensor_is_unused_weights() {
    let dir = copy_of(base(), "extra");
    edit_shard(&dir, SHARD, |t| {
        t.insert("model.layers.0.self_attn.stray_proj.weight".into(), Array::zeros(&[4, 4], Dtype::Bf16).unwrap());
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::UnusedWeights { count: 1, first, .. } if first == &["layers.0.self_attn.stray_proj.weight".to_string()]),
        "{e:?}"
    );
    assert_mentions(&e, &["layers.0.self_attn.stray_proj.weight", "not used", &dir_str(&dir)]);
}

#[test]
fn index_listing_a_missing_shard() {
    let dir = copy_of(base(), "index");
    let index = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    let map = v["weight_map"].as_object_mut().unwrap();
    let first = map.keys().next().unwrap().clone();
    map.insert(first, Value::String("model-00002-of-00002.safetensors".into()));
    std::fs::write(&index, serde_json::to_string(&v).unwrap()).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::MissingShard { shard, .. } if shard == "model-00002-of-00002.safetensors"), "{e:?}");
    assert_mentions(&e, &["model-00002-of-00002.safetensors", "does not exist", &dir_str(&dir)]);
}

#[test]
fn no_safetensors_is_no_weights() {
    let dir = copy_of(base(), "noweights");
    std::fs::remove_file(dir.join(SHARD)).unwrap();
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::NoWeights { dir: d } if d == &*dir), "{e:?}");
    assert_mentions(&e, &["no model*.safetensors", &dir_str(&dir)]);
    // Unrelated safetensors files do not count as weights.
    std::fs::write(dir.join("adapter.safetensors"), b"").unwrap();
    assert!(matches!(load_err(&dir), Error::NoWeights { .. }));
}

/// Damages the shard's bytes with `damage` and returns the load error.
fn corrupt(name: &str, damage: impl FnOnce(Vec<u8>) -> Vec<u8>) -> (PathBuf, Error) {
    let dir = copy_of(base(), name);
    let path = dir.join(SHARD);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, damage(bytes)).unwrap();
    let e = load_err(&dir);
    (path, e)
}

#[test]
fn corrupt_safetensors_names_the_file() {
    let header_len = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    type Corrupt = Box<dyn FnOnce(Vec<u8>) -> Vec<u8>>;
    let cases: Vec<(&str, Corrupt)> = vec![
        ("garbage", Box::new(|_| b"this is not a safetensors file at all".to_vec())),
        ("empty", Box::new(|_| Vec::new())),
        // A header length pointing past the end of the file.
        (
            "header-len",
            Box::new(|mut b: Vec<u8>| {
                let n = (b.len() as u64 * 2).to_le_bytes();
                b[..8].copy_from_slice(&n);
                b
            }),
        ),
        // Broken JSON in the header.
        (
            "header-json",
            Box::new(move |mut b: Vec<u8>| {
                let n = header_len(&b);
                b[8 + n / 2] = b'\x01';
                b[9] = b'!';
                b
            }),
        ),
        // Data cut short: the header promises more bytes than the file has.
        (
            "truncated",
            Box::new(move |b: Vec<u8>| {
                let n = header_len(&b);
                let keep = 8 + n + (b.len() - 8 - n) / 2;
                b[..keep].to_vec()
            }),
        ),
    ];
    for (name, damage) in cases {
        let (path, e) = corrupt(&format!("corrupt-{name}"), damage);
        // Truncation is caught by the header check (data_offsets past the end), the rest by MLX.
        let named = match &e {
            Error::Mlx(mlx_core::Error::Safetensors { path: p, .. }) => p == &path,
            Error::Shard { path: p, .. } => p == &path && name == "truncated",
            _ => false,
        };
        assert!(named, "{name}: {e:?}");
        assert_mentions(&e, &[&path.display().to_string()]);
    }
}

/// Header errors quote the header's own text, never the JSON parser's debug form.
#[test]
fn header_shape_and_dtype_errors_read_as_the_header_does() {
    let dir = copy_of(base(), "header-words");
    let path = dir.join(SHARD);
    edit_header(&path, |h| h["model.norm.weight"]["shape"] = serde_json::json!([7, 3]));
    let e = load_err(&dir);
    assert_mentions(&e, &["model.norm.weight", "shape [7,3]"]);
    assert!(!e.to_string().contains("Number("), "{e}");
    let dir = copy_of(base(), "header-dtype");
    let path = dir.join(SHARD);
    edit_header(&path, |h| {
        h["model.norm.weight"].as_object_mut().unwrap().remove("dtype");
    });
    let e = load_err(&dir);
    assert_mentions(&e, &["model.norm.weight", "has no dtype"]);
    assert!(!e.to_string().contains("dtype ?"), "{e}");
}

#[test]
fn quantized_scales_of_the_wrong_shape() {
    // q_proj of layer 0: weight [128, 16] u32, scales/biases [128, 2] for 4 bits, group 64.
    type Reshape = fn(&[i32]) -> Vec<i32>;
    let cases: [(&str, Reshape); 3] =
        [("rows", |s| vec![s[0] - 1, s[1]]), ("groups", |s| vec![s[0], s[1] * 2]), ("rank", |s| vec![s[0] * s[1]])];
    for (what, reshape) in cases {
        let dir = copy_of(base_q4(), &format!("qscales-{what}"));
        let key = "model.layers.0.self_attn.q_proj.scales";
        let mut bad = Vec::new();
        edit_shard(&dir, SHARD, |t| {
            let orig = t.get(key).expect("q_proj is quantized").shape().unwrap();
            assert_eq!(orig, vec![128, 2]);
            bad = reshape(&orig);
            t.insert(key.into(), Array::zeros(&bad, Dtype::Bf16).unwrap());
        });
        let e = load_err(&dir);
        assert!(
            matches!(&e, Error::Quantization { name, .. } if name.starts_with("layers.0.self_attn.q_proj")),
            "{what}: {e:?}"
        );
        assert_mentions(&e, &["layers.0.self_attn.q_proj", "scales", &format!("{bad:?}"), &dir_str(&dir)]);
    }
}

#[test]
fn quantized_packed_weight_of_the_wrong_dtype() {
    let dir = copy_of(base_q4(), "qdtype");
    edit_shard(&dir, SHARD, |t| {
        let key = "model.layers.0.mlp.up_proj.weight";
        let shape = t[key].shape().unwrap();
        t.insert(key.into(), Array::zeros(&shape, Dtype::Bf16).unwrap());
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Quantization { name, .. } if name == "layers.0.mlp.up_proj.weight"), "{e:?}");
    assert_mentions(&e, &["layers.0.mlp.up_proj.weight", "uint32"]);
}

/// Replaces `config.json` with `edit` applied to the base's, and returns the load error.
fn bad_config(name: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> (PathBuf, Error) {
    let dir = copy_of(base(), name);
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(v.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    (path, load_err(&dir))
}

fn in_file(e: &Error) -> Option<(&PathBuf, &ConfigError)> {
    match e {
        Error::Config(ConfigError::InFile { path, source }) => Some((path, source)),
        _ => None,
    }
}

#[test]
fn bad_config_field_names_file_and_field() {
    type Edit = fn(&mut serde_json::Map<String, Value>);
    let cases: [(&str, &str, Edit); 4] = [
        ("zero", "sliding_window", |m| {
            m.insert("sliding_window".into(), 0.into());
        }),
        ("type", "num_hidden_layers", |m| {
            m.insert("num_hidden_layers".into(), "six".into());
        }),
        ("layer-type", "layer_types[1]", |m| {
            m.insert(
                "layer_types".into(),
                serde_json::json!([
                    "sliding_attention",
                    "global",
                    "full_attention",
                    "sliding_attention",
                    "sliding_attention",
                    "full_attention"
                ]),
            );
        }),
        ("shared", "num_kv_shared_layers", |m| {
            m.insert("num_kv_shared_layers".into(), 6.into());
        }),
    ];
    for (name, field, edit) in cases {
        let (path, e) = bad_config(&format!("config-{name}"), edit);
        let (p, inner) = in_file(&e).unwrap_or_else(|| panic!("{name}: not a config error in a file: {e:?}"));
        assert_eq!(p, &path);
        assert!(
            matches!(inner, ConfigError::Invalid { field: f, .. } | ConfigError::Type { field: f, .. } if f.starts_with(field)),
            "{name}: {inner:?}"
        );
        assert_mentions(&e, &[&path.display().to_string(), field]);
    }
}

#[test]
fn nested_config_errors_name_the_text_config_field() {
    let hf_dir = Scratch::new("hf");
    let hf = write_hf_layout(base(), &hf_dir, true).unwrap();
    Model::load(&hf).unwrap();
    let dir = copy_of(&hf, "hf-bad");
    let path = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["text_config"]["head_dim"] = Value::from(0);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(in_file(&e), Some((p, ConfigError::Invalid { field, .. })) if p == &path && field == "text_config.head_dim"),
        "{e:?}"
    );
    assert_mentions(&e, &[&path.display().to_string(), "text_config.head_dim"]);
    v["text_config"]["head_dim"] = Value::from(32);
    v["text_config"]["rms_norm_eps"] = Value::from("small");
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let e = load_err(&dir);
    assert!(
        matches!(in_file(&e), Some((_, ConfigError::Type { field, .. })) if field == "text_config.rms_norm_eps"),
        "{e:?}"
    );
    assert_mentions(&e, &[&path.display().to_string(), "text_config.rms_norm_eps"]);
}

#[test]
fn unreadable_config_names_config_json() {
    let dir = copy_of(base(), "config-json");
    let path = dir.join("config.json");
    std::fs::write(&path, "{\"model_type\": \"gemma4_text\", \"hidden_size\": 128,").unwrap();
    let e = load_err(&dir);
    assert!(matches!(in_file(&e), Some((p, ConfigError::Json { .. })) if p == &path), "{e:?}");
    assert_mentions(&e, &[&path.display().to_string(), "JSON"]);
    std::fs::remove_file(&path).unwrap();
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Config(ConfigError::Io { path: p, .. }) if p == &path), "{e:?}");
    assert_mentions(&e, &[&path.display().to_string()]);
}

/// Files the loader reads that are endless devices or far too large are refused before they
/// are read (a link to /dev/zero was read 6.5 GB deep before).
#[cfg(unix)]
#[test]
fn config_and_tokenizer_that_are_devices_or_huge_are_refused_at_once() {
    let dir = copy_of(base(), "config-device");
    let path = dir.join("config.json");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    let t0 = std::time::Instant::now();
    let e = load_err(&dir);
    assert_mentions(&e, &[&path.display().to_string(), "not a regular file"]);
    assert!(t0.elapsed().as_secs() < 5, "refusing took {:?}", t0.elapsed());

    std::fs::remove_file(&path).unwrap();
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(mlx_core::files::JSON_LIMIT + 1).unwrap(); // sparse: no disk used
    let e = load_err(&dir);
    assert_mentions(&e, &[&path.display().to_string(), "at most 16 MiB"]);

    let tok = dir.join("tokenizer.json");
    let _ = std::fs::remove_file(&tok);
    std::os::unix::fs::symlink("/dev/zero", &tok).unwrap();
    let Err(e) = gemma4::tokenizer::Tokenizer::from_dir(&dir) else { panic!("a device as tokenizer.json loaded") };
    assert!(e.to_string().contains("tokenizer.json") && e.to_string().contains("not a regular file"), "{e}");
}

/// NaN weights load (checking every weight would read the whole checkpoint) but the first
/// forward's logits are refused, naming the checkpoint, instead of decoding pad tokens.
#[test]
fn non_finite_weights_fail_on_the_first_forward_naming_the_checkpoint() {
    use gemma4::generate::{generate, GenerateConfig};
    let dir = copy_of(base(), "nan-weights");
    edit_shard(&dir, SHARD, |t| {
        let w = t.get("model.norm.weight").expect("fixture has model.norm.weight");
        let nan = Array::scalar(f64::NAN, w.dtype()).unwrap();
        let poisoned = w.multiply(&nan).unwrap();
        t.insert("model.norm.weight".into(), poisoned);
    });
    let model = Model::load(&dir).unwrap();
    let cfg = GenerateConfig { max_tokens: 4, ..Default::default() };
    let e = generate(&model, &[2, 5, 6], &cfg, |_| {}).unwrap_err();
    assert!(matches!(e, Error::NonFinite { .. }), "{e:?}");
    assert_mentions(&e, &[&dir_str(&dir), "non-finite logits"]);
    // The undamaged checkpoint passes the same check.
    let ok = Model::load(&copy_of(base(), "finite-weights")).unwrap();
    assert_eq!(generate(&ok, &[2, 5, 6], &cfg, |_| {}).unwrap().tokens.len(), 4);
}

#[test]
fn duplicate_tensor_across_shards_names_both() {
    let dir = Scratch::new("dup");
    write_random_checkpoint(&dir, &tiny_config_a(), 7, Dtype::Bf16, 2, true).unwrap();
    let (a, b) = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    let moved = load_safetensors(&dir.join(a)).unwrap().tensors.into_iter().next().unwrap();
    edit_shard(&dir, b, |t| {
        t.insert(moved.0.clone(), moved.1);
    });
    let e = load_err(&dir);
    assert!(
        matches!(&e, Error::DuplicateTensor { name, first, second, .. } if name == &moved.0 && first == a && second == b),
        "{e:?}"
    );
    assert_mentions(&e, &[&moved.0, a, b]);
}

#[test]
fn quantizing_a_quantized_checkpoint_is_refused() {
    let dest = Scratch::new("q4-again");
    let e = quantize_checkpoint(base_q4(), &dest, 4, 64, true).unwrap_err();
    assert!(matches!(&e, Error::Input { op: "quantize", .. }), "{e:?}");
    assert_mentions(&e, &["already quantized", &dir_str(base_q4())]);
    assert!(!dest.exists(), "a refused quantize must not create {}", dest.display());
}

#[test]
fn writing_into_a_non_empty_dir_is_refused_cleanly() {
    let parent = Scratch::new("nonempty");
    let dest = parent.join("ckpt");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("notes.txt"), "keep me").unwrap();
    let listing = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    for writer in ["random", "quantize"] {
        let e = match writer {
            "random" => write_random_checkpoint(&dest, &tiny_config_a(), 7, Dtype::Bf16, 1, false).unwrap_err(),
            _ => quantize_checkpoint(base(), &dest, 4, 64, false).unwrap_err(),
        };
        assert!(matches!(&e, Error::Input { .. }), "{writer}: {e:?}");
        assert_mentions(&e, &[&dir_str(&dest), "not empty", "force"]);
        assert_eq!(listing(&dest), vec!["notes.txt".to_string()], "{writer}: the destination was touched");
        assert_eq!(std::fs::read_to_string(dest.join("notes.txt")).unwrap(), "keep me");
        assert_eq!(listing(&parent), vec!["ckpt".to_string()], "{writer}: something was left next to the destination");
    }
    // An empty directory is fine without force, and nothing is left beside it either.
    let empty = parent.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    write_random_checkpoint(&empty, &tiny_config_a(), 7, Dtype::Bf16, 1, false).unwrap();
    assert!(empty.join("config.json").is_file() && empty.join(SHARD).is_file());
    assert_eq!(listing(&parent), vec!["ckpt".to_string(), "empty".to_string()]);
    assert!(listing(&empty).iter().all(|f| !f.contains(".tmp-")), "{:?}", listing(&empty));
}

#[test]
fn tensors_of_the_wrong_element_type_are_named() {
    // Element types no Gemma-4 tensor may have are refused from the header, naming file and tensor.
    let key = "model.layers.2.self_attn.q_proj.weight";
    for dtype in [Dtype::I8, Dtype::I16, Dtype::Bool, Dtype::C64] {
        let dir = copy_of(base(), &format!("dtype-{dtype}"));
        edit_shard(&dir, SHARD, |t| {
            let a = t[key].astype(dtype).unwrap();
            t.insert(key.into(), a);
        });
        let e = load_err(&dir);
        assert!(matches!(&e, Error::Shard { tensor, .. } if tensor == key), "{dtype}: {e:?}");
        assert_mentions(&e, &[&dir.join(SHARD).display().to_string(), key, "expected F32, F16 or BF16"]);
    }
    // fp8, which MLX cannot even name: the header says so.
    let dir = copy_of(base(), "dtype-fp8");
    edit_header(&dir.join(SHARD), |h| {
        h[key]["dtype"] = Value::String("F8_E4M3".into());
    });
    let e = load_err(&dir);
    assert_mentions(&e, &[&dir.join(SHARD).display().to_string(), key, "dtype F8_E4M3", "expected"]);
    // uint32 is allowed in a file (packed weights), but not for a norm: the model says which.
    let dir = copy_of(base(), "dtype-u32-norm");
    edit_shard(&dir, SHARD, |t| {
        let a = t["model.norm.weight"].astype(Dtype::U32).unwrap();
        t.insert("model.norm.weight".into(), a);
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::WeightDtype { name, .. } if name == "norm.weight"), "{e:?}");
    assert_mentions(&e, &[&dir.join(SHARD).display().to_string(), "norm.weight", "uint32", "float"]);
}

#[test]
fn quantized_scales_of_the_wrong_dtype_are_named() {
    let dir = copy_of(base_q4(), "qscales-dtype");
    let key = "model.layers.0.mlp.up_proj.scales";
    edit_shard(&dir, SHARD, |t| {
        let a = t[key].astype(Dtype::U32).unwrap();
        t.insert(key.into(), a);
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::WeightDtype { name, .. } if name == "layers.0.mlp.up_proj.scales"), "{e:?}");
    assert_mentions(&e, &["layers.0.mlp.up_proj.scales", "uint32", "float", SHARD]);
}

#[test]
fn missing_scales_are_named_as_missing() {
    let dir = copy_of(base_q4(), "qscales-missing");
    let key = "model.layers.0.self_attn.q_proj.scales";
    edit_shard(&dir, SHARD, |t| {
        assert!(t.remove(key).is_some());
    });
    edit_index(&dir, |m| {
        m.remove(key);
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Quantization { .. }), "{e:?}");
    assert_mentions(&e, &["\"layers.0.self_attn.q_proj.scales\" is missing from the checkpoint"]);
    assert!(!e.to_string().contains("do not fit"), "{e}");
}

#[test]
fn index_entries_outside_the_checkpoint_are_refused() {
    for (i, shard) in ["../model.safetensors", "/tmp/model.safetensors", "sub/model.safetensors", "weights.bin"]
        .into_iter()
        .enumerate()
    {
        let dir = copy_of(base(), &format!("index-outside-{i}"));
        edit_index(&dir, |m| {
            m.insert("model.norm.weight".into(), Value::String(shard.into()));
        });
        let e = load_err(&dir);
        assert!(matches!(&e, Error::Index { entry, .. } if entry == "model.norm.weight"), "{shard}: {e:?}");
        assert_mentions(&e, &["model.safetensors.index.json", "model.norm.weight", shard]);
    }
}

#[test]
fn index_entry_naming_an_absent_tensor_is_refused() {
    let dir = copy_of(base(), "index-absent");
    edit_index(&dir, |m| {
        m.insert("model.layers.0.ghost.weight".into(), Value::String(SHARD.into()));
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Index { entry, .. } if entry == "model.layers.0.ghost.weight"), "{e:?}");
    assert_mentions(&e, &["model.safetensors.index.json", "model.layers.0.ghost.weight", SHARD, "does not contain"]);
}

#[test]
fn overlapping_tensor_data_is_refused() {
    let dir = copy_of(base(), "overlap");
    let (a, b) = ("model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight");
    edit_header(&dir.join(SHARD), |h| {
        let offsets = h[a]["data_offsets"].clone();
        h[b]["data_offsets"] = offsets;
    });
    let e = load_err(&dir);
    assert!(matches!(&e, Error::Shard { .. }), "{e:?}");
    assert_mentions(&e, &[&dir.join(SHARD).display().to_string(), a, b, "overlap"]);
}

#[test]
fn drafter_checkpoints_are_named_as_such() {
    let dir = copy_of(base(), "drafter-dspark-json");
    std::fs::write(dir.join("dspark.json"), "{}").unwrap();
    let e = load_err(&dir);
    assert_mentions(&e, &[&dir_str(&dir), "this is a drafter checkpoint, not a target", "dspark.json"]);
    let (_, e) = bad_config("drafter-arch", |c| {
        c.insert("architectures".into(), serde_json::json!(["Gemma4DSparkModel"]));
        c.insert("model_type".into(), Value::String("gemma4_dspark".into()));
    });
    assert_mentions(&e, &["this is a drafter checkpoint, not a target", "Gemma4DSparkModel"]);
}
