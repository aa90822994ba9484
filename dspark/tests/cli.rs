//! The `dspark` binary's refusals: each bad command line must fail with a message naming the
//! flag, and leave every file as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use mlx_core::Dtype;
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};

use gemma4::testing::Scratch;

/// A tiny random target (tiny config A, with a tokenizer) in `dir`.
fn write_target(dir: &Path) -> PathBuf {
    write_random_checkpoint(dir, &tiny_config_a(), 3, Dtype::Bf16, 1, false).expect("target")
}

/// A random DSpark drafter for tiny config A in `dir`.
fn write_drafter(dir: &Path) -> PathBuf {
    let cfg = DSparkConfig { markov_rank: 64, ..DSparkConfig::with_taps(vec![1, 3, 6]) };
    DSparkDrafter::init(cfg, &tiny_config_a(), "tiny", 7, true).expect("init").save(dir, false).expect("save")
}

/// Runs the binary with `DSPARK_HOME` set to `home` (so nothing touches the user's cache).
fn dspark(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dspark")).args(args).env("DSPARK_HOME", home).output().expect("run dspark")
}

/// Asserts the run failed with a message containing every one of `needles`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

/// Every file under `dir` with its bytes, to compare before and after.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).expect("read file")));
            }
        }
    }
    out.sort();
    out
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn quantize_target_refuses_an_out_that_is_contains_or_is_inside_the_model() {
    let sc = Scratch::create("qt-out");
    let model = write_target(&sc.join("model"));
    std::fs::create_dir_all(sc.join("sibling")).unwrap();
    std::fs::write(sc.join("sibling/keep.txt"), "precious").unwrap();
    let home = sc.join("home");
    let before = snapshot(&sc.0);
    let nested = model.join("q4");
    let dotted = sc.join("sibling/../model/.");
    for (out, why) in [
        (sc.0.as_path(), "contains the source"),
        (model.as_path(), "is the source"),
        (dotted.as_path(), "is the source"),
        (nested.as_path(), "is inside the source"),
    ] {
        let r = dspark(&home, &["quantize-target", "--model", s(&model), "--out", s(out), "--force"]);
        fails_with(&r, &["--out", why]);
        assert_eq!(snapshot(&sc.0), before, "--out {} changed files", out.display());
    }
    assert!(!nested.exists());
}

#[test]
fn quantize_target_still_writes_a_sibling_out() {
    let sc = Scratch::create("qt-ok");
    let model = write_target(&sc.join("model"));
    let out = sc.join("model-q8");
    let r = dspark(&sc.join("home"), &["quantize-target", "--model", s(&model), "--out", s(&out), "--bits", "8"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.join("config.json").is_file());
}

#[test]
fn a_drafter_passed_as_model_is_named_as_such() {
    let sc = Scratch::create("drafter-as-model");
    let drafter = write_drafter(&sc.join("drafter"));
    let home = sc.join("home");
    let r = dspark(&home, &["generate", "--model", s(&drafter), "--tokens", "5 6"]);
    fails_with(&r, &["drafter checkpoint, not a Gemma-4 target", "pass it as --drafter"]);
    let r = dspark(&home, &["calibrate", "--model", s(&drafter), "--drafter", s(&drafter)]);
    fails_with(&r, &["drafter checkpoint, not a Gemma-4 target"]);
    let r = dspark(&home, &["quantize-target", "--model", s(&drafter)]);
    fails_with(&r, &["drafter checkpoint, not a Gemma-4 target"]);
    assert!(!home.exists(), "nothing may be written to DSPARK_HOME");
}

#[test]
fn drafter_options_without_a_drafter_are_refused() {
    let sc = Scratch::create("needs-drafter");
    let home = sc.join("home");
    // The default model brings its drafter; `--drafter none` turns it off.
    for flags in [&["--gamma", "3"][..], &["--min-conf", "0.5"], &["--calibrated"], &["--compare"]] {
        let mut args = vec!["generate", "--drafter", "none", "--tokens", "5 6", "--max-tokens", "2"];
        args.extend_from_slice(flags);
        let r = dspark(&home, &args);
        fails_with(&r, &[flags[0], "--drafter"]);
    }
    assert!(!home.exists(), "nothing may be written to DSPARK_HOME");
}

#[test]
fn negative_values_reach_the_range_checks() {
    let sc = Scratch::create("negative");
    let home = sc.join("home");
    let r = dspark(&home, &["generate", "--tokens", "5", "--temperature", "-1"]);
    fails_with(&r, &["--temperature", "got -1"]);
    // Finite and positive, but 1/T leaves f32 (it failed inside MLX before).
    for t in ["1e308", "1e-300", "1e-45"] {
        let r = dspark(&home, &["generate", "--tokens", "5", "--temperature", t]);
        fails_with(&r, &["--temperature", "1/T"]);
    }
    let r = dspark(&home, &["generate", "--tokens", "5", "--top-p", "-0.5"]);
    fails_with(&r, &["top_p must be in [0, 1], got -0.5"]);
    let r = dspark(&home, &["calibrate", "--drafter", "d", "--target", "-0.5"]);
    fails_with(&r, &["--target -0.5", "(0, 1]"]);
    // Unsigned options say the value is not a number of that kind, rather than "unexpected argument".
    let r = dspark(&home, &["generate", "--tokens", "5", "--max-tokens", "-3"]);
    fails_with(&r, &["--max-tokens", "-3"]);
    assert!(!String::from_utf8_lossy(&r.stderr).contains("unexpected argument"));
    assert!(!home.exists(), "nothing may be written to DSPARK_HOME");
}

#[test]
fn calibrate_refuses_bad_flags_before_writing_anything() {
    let sc = Scratch::create("calibrate-flags");
    let model = write_target(&sc.join("model"));
    let drafter = write_drafter(&sc.join("drafter"));
    let home = sc.join("home");
    std::fs::write(sc.join("a-file"), "not a directory").unwrap();
    let (file, dir_path) = (sc.join("a-file"), sc.join("drafter"));
    let in_file = format!("{}/x", s(&file));
    let (in_file, file_s, dir_s) = (in_file.as_str(), s(&file), s(&dir_path));
    let before = snapshot(&sc.0);
    let bad: &[(&[&str], &str)] = &[
        (&["--target", "nan"], "--target NaN"),
        (&["--target", "inf"], "--target inf"),
        (&["--target", "0"], "--target 0"),
        (&["--target", "1.5"], "--target 1.5"),
        (&["--tokens", "0"], "--tokens 0"),
        (&["--prompts", "0"], "'0' for '--prompts"),
        (&["--prompts", "4000000000"], "'4000000000' for '--prompts"),
        (&["--prompts", "4294967296"], "'4294967296' for '--prompts"),
        (&["--prompts", "100001"], "expected 2 to 100000"),
        (&["--prompts", "1"], "expected 2 to 100000"),
        // Outputs that cannot be written are found before the decodes, not after them.
        (&["--rounds-out", dir_s], "--rounds-out"),
        (&["--rounds-out", in_file], "is not a directory"),
        (&["--plot", in_file], "--plot"),
        (&["--out", in_file], "--out"),
        (&["--out", file_s], "--out"),
    ];
    for &(flags, msg) in bad {
        let mut args = vec!["calibrate", "--model", s(&model), "--drafter", s(&drafter), "--force"];
        args.extend_from_slice(flags);
        let r = dspark(&home, &args);
        fails_with(&r, &[msg]);
        assert_eq!(snapshot(&sc.0), before, "{flags:?} changed files");
    }
    assert!(!home.exists());
}

#[test]
fn calibrate_refuses_the_default_drafter_for_another_model() {
    let sc = Scratch::create("calibrate-default");
    let model = write_target(&sc.join("model"));
    let home = sc.join("home");
    let r = dspark(&home, &["calibrate", "--model", s(&model), "--drafter", "default", "--force"]);
    fails_with(&r, &["--drafter default", "pass your own drafter directory"]);
    // The embedded drafter is never recalibrated in place.
    let r = dspark(&home, &["calibrate", "--drafter", "default", "--force"]);
    fails_with(&r, &["--drafter default", "--out DIR"]);
    assert!(!home.exists(), "the default drafter must be neither written nor refitted");
}

#[test]
fn calibrate_profile_and_the_throughput_schedule_end_to_end() {
    let sc = Scratch::create("calibrate-e2e");
    let model = write_target(&sc.join("model"));
    let drafter = write_drafter(&sc.join("drafter"));
    let home = sc.join("home");
    let ok = |r: &Output| {
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        String::from_utf8_lossy(&r.stdout).into_owned()
    };
    for (flags, msg) in [
        (&["--temperatures", "0,0"][..], "expected 0 (greedy), one positive temperature"),
        (&["--temperatures", "-1"], "-1 is not a temperature"),
    ] {
        let mut args = vec!["calibrate", "--model", s(&model), "--drafter", s(&drafter)];
        args.extend_from_slice(flags);
        fails_with(&dspark(&home, &args), &[msg]);
    }
    // Without a profile and a calibration, --schedule throughput says what is missing.
    let gen = ["generate", "--model", s(&model), "--drafter", s(&drafter), "--tokens", "5 6 7", "--max-tokens", "24"];
    let r = dspark(&home, &[&gen[..], &["--schedule", "throughput"]].concat());
    fails_with(&r, &["no STS temperatures for greedy decoding", "dspark calibrate", "dspark profile"]);

    let out = ok(&dspark(
        &home,
        &[
            "calibrate",
            "--model",
            s(&model),
            "--drafter",
            s(&drafter),
            "--prompts",
            "6",
            "--tokens",
            "24",
            "--min-samples",
            "5",
            "--rounds-out",
            s(&sc.join("rounds.jsonl")),
            "--min-map-rounds",
            "1",
        ],
    ));
    assert!(out.contains("ECE raw") && out.contains("ECE scaled") && out.contains("sampled, T = 1"), "{out}");
    // Every verify round is written, both modes, as the fit saw it.
    let rounds: Vec<serde_json::Value> = std::fs::read_to_string(sc.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for t in [0.0, 1.0] {
        let mode: Vec<_> = rounds.iter().filter(|r| r["temperature"] == t).collect();
        assert!(!mode.is_empty(), "no rounds at temperature {t}");
        assert!(mode.iter().all(|r| r["accepted"].as_u64().unwrap() as usize <= r["logits"].as_array().unwrap().len()));
    }
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(drafter.join("dspark.json")).unwrap()).unwrap();
    let sts = &d["config"]["sts"];
    let gamma = d["config"]["gamma"].as_u64().unwrap() as usize;
    assert_eq!(sts["version"], 3);
    for mode in ["greedy", "sampled"] {
        let t = sts[mode]["temperatures"].as_array().expect("temperatures");
        assert_eq!(t.len(), gamma);
        assert!(t.iter().all(|t| t.as_f64().unwrap() > 0.0));
        let maps = sts[mode]["survivalMaps"].as_array().expect("survival maps");
        assert_eq!(maps.len(), gamma);
        assert!(!maps[0].as_array().unwrap().is_empty(), "position 1 has rounds, so a map");
    }
    let r = dspark(&home, &["calibrate", "--model", s(&model), "--drafter", s(&drafter)]);
    fails_with(&r, &["already calibrated", "--force"]);
    // Refitting from the written rounds gives the same fits, without a decode.
    let refit = sc.join("refit");
    let rounds_file = sc.join("rounds.jsonl");
    let from_file = ["calibrate", "--model", s(&model), "--drafter", s(&drafter), "--rounds-in", s(&rounds_file)];
    let flags = ["--min-samples", "5", "--min-map-rounds", "1", "--out", s(&refit)];
    ok(&dspark(&home, &[&from_file[..], &flags].concat()));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(refit.join("dspark.json")).unwrap()).unwrap();
    for mode in ["greedy", "sampled"] {
        assert_eq!(r["config"]["sts"][mode], sts[mode], "{mode} refitted from the rounds");
    }
    let bad = sc.join("bad-rounds.jsonl");
    std::fs::write(&bad, "{\"temperature\": 0, \"prompt\": 0, \"logits\": [0.5], \"accepted\": 2}\n").unwrap();
    let r = dspark(
        &home,
        &["calibrate", "--model", s(&model), "--drafter", s(&drafter), "--rounds-in", s(&bad), "--force"],
    );
    fails_with(&r, &["bad-rounds.jsonl line 1", "1 drafts with 2 accepted"]);

    let out = ok(&dspark(&home, &["profile", "--model", s(&model), "--drafter", s(&drafter), "--repeats", "1"]));
    assert!(out.contains("| 2 |") && model.join("dspark-profile.json").is_file(), "{out}");
    assert!(out.contains("| k (drafts proposed) |"), "proposals are priced by length: {out}");
    let prof: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("dspark-profile.json")).unwrap()).unwrap();
    let entry = prof["profiles"].as_object().and_then(|p| p.values().next()).expect("one profile");
    for field in ["draftByLen", "draftByLenSampled"] {
        let d = entry[field].as_array().unwrap_or_else(|| panic!("{field} in {entry}"));
        assert_eq!(d.len(), gamma, "{field}: one cost per draft length");
    }

    let plain = ok(&dspark(&home, &["generate", "--model", s(&model), "--tokens", "5 6 7", "--max-tokens", "24"]));
    let r = dspark(&home, &[&gen[..], &["--schedule", "throughput"]].concat());
    assert_eq!(ok(&r), plain, "greedy output under the throughput schedule");
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("throughput schedule (greedy STS") && !err.contains("warning"), "{err}");
    // auto picks it too; --min-conf overrides it, and cannot be combined with it.
    let r = dspark(&home, &gen);
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("throughput schedule"),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let r = dspark(&home, &[&gen[..], &["--schedule", "throughput", "--min-conf", "0.5"]].concat());
    fails_with(&r, &["--schedule throughput chooses the window itself"]);
}

#[test]
fn without_config_eos_ids_the_tokenizer_eos_stops_and_an_id_prompt_still_prints_ids() {
    let sc = Scratch::create("eos-fallback");
    let mut cfg = tiny_config_a();
    cfg.eos_token_ids = vec![];
    let model = write_random_checkpoint(&sc.join("model"), &cfg, 3, Dtype::Bf16, 1, false).expect("target");
    let home = sc.join("home");
    let ids = |r: &Output| -> Vec<u32> {
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        String::from_utf8_lossy(&r.stdout).split_whitespace().map(|t| t.parse().expect("an id")).collect()
    };
    let base = ["generate", "--model", s(&model), "--tokens", "5 6", "--max-tokens", "12"];
    let free = ids(&dspark(&home, &[&base[..], &["--ignore-eos"]].concat()));
    assert_eq!(free.len(), 12);
    // Make the first token that is not a repeat (after the first) the tokenizer's eos: greedy
    // decoding then stops just before it. The word-level vocabulary names id i `t{i}`.
    let k = (1..free.len()).find(|&k| !free[..k].contains(&free[k])).expect("a new token");
    std::fs::write(model.join("tokenizer_config.json"), format!(r#"{{"eos_token": "t{}"}}"#, free[k])).unwrap();
    let r = dspark(&home, &base);
    assert_eq!(ids(&r), free[..k], "the output stays ids and ends before the eos");
    assert!(String::from_utf8_lossy(&r.stderr).contains("finish: stop"), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn generate_refuses_serving_flags_it_cannot_honour() {
    // dspark-serve's own refusals are tested in the serve package, against its binary.
    let home = Scratch::create("cli-serve-flags");
    let r = dspark(&home, &["generate", "--tokens", "5 6", "--stop", "t7"]);
    fails_with(&r, &["--stop"]);
    let r = dspark(&home, &["generate", "--tokens", "5 6", "--chat"]);
    fails_with(&r, &["--prompt"]);
}

#[test]
fn generate_reads_a_prompt_file_or_standard_input() {
    let sc = Scratch::create("prompt-file");
    let model = write_target(&sc.join("model"));
    let home = sc.join("home");
    let text = "t5 t6\nt7 t8\n";
    let file = sc.join("prompt.txt");
    std::fs::write(&file, text).unwrap();
    let base = ["generate", "--model", s(&model), "--max-tokens", "6", "--drafter", "none"];
    let direct = dspark(&home, &[&base[..], &["--prompt", text]].concat());
    assert!(direct.status.success(), "{}", String::from_utf8_lossy(&direct.stderr));
    let from_file = dspark(&home, &[&base[..], &["--prompt-file", s(&file)]].concat());
    assert!(from_file.status.success(), "{}", String::from_utf8_lossy(&from_file.stderr));
    assert_eq!(from_file.stdout, direct.stdout, "a prompt file is the same prompt as --prompt");
    let mut child = Command::new(env!("CARGO_BIN_EXE_dspark"))
        .args([&base[..], &["--prompt-file", "-"]].concat())
        .env("DSPARK_HOME", &home)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success(), "{}", String::from_utf8_lossy(&piped.stderr));
    assert_eq!(piped.stdout, direct.stdout, "- reads standard input");
    let r = dspark(&home, &[&base[..], &["--prompt-file", s(&sc.join("missing.txt"))]].concat());
    fails_with(&r, &["--prompt-file", "missing.txt"]);
    let r = dspark(&home, &[&base[..], &["--prompt-file", s(&file), "--prompt", "t5"]].concat());
    assert!(!r.status.success(), "--prompt and --prompt-file conflict");
}

#[test]
fn flags_out_of_the_models_range_are_refused_with_the_range() {
    let sc = Scratch::create("model-ranges");
    let model = write_target(&sc.join("model"));
    let home = sc.join("home");
    let r = dspark(
        &home,
        &["generate", "--model", s(&model), "--tokens", "5", "--temperature", "1", "--top-k", "18446744073709551615"],
    );
    fails_with(&r, &["--top-k", "below the vocabulary of"]);
    assert!(!String::from_utf8_lossy(&r.stderr).contains("(0, 18446744073709551615)"));
    // The context must fit the model's positions, found from config.json before the weights.
    let r = dspark(&home, &["profile", "--model", s(&model), "--drafter", "none", "--context", "100000"]);
    fails_with(&r, &["--context 100000", "max_position_embeddings"]);
    // Counts out of their range are refused by the flag's parser, with the range.
    let r = dspark(&home, &["profile", "--model", s(&model), "--drafter", "none", "--context", "1"]);
    fails_with(&r, &["--context", "expected at least 2 tokens in the cache"]);
    let r = dspark(&home, &["profile", "--model", s(&model), "--drafter", "none", "--max-n", "65"]);
    fails_with(&r, &["--max-n", "expected 2 to 64 tokens"]);
    assert!(!model.join("dspark-profile.json").exists());
}

#[test]
fn compare_prints_no_speedup_when_a_run_generated_nothing() {
    let sc = Scratch::create("compare-empty");
    let mut cfg = tiny_config_a();
    cfg.eos_token_ids = vec![];
    let model = write_random_checkpoint(&sc.join("model"), &cfg, 3, Dtype::Bf16, 1, false).expect("target");
    let home = sc.join("home");
    let base = ["generate", "--model", s(&model), "--tokens", "5 6", "--max-tokens", "4", "--drafter", "self"];
    let r = dspark(&home, &[&base[..], &["--ignore-eos"]].concat());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let first: u32 = String::from_utf8_lossy(&r.stdout).split_whitespace().next().unwrap().parse().unwrap();
    // The first greedy token becomes end-of-sequence: both runs stop before emitting anything.
    std::fs::write(model.join("tokenizer_config.json"), format!(r#"{{"eos_token": "t{first}"}}"#)).unwrap();
    let r = dspark(&home, &[&base[..], &["--compare"]].concat());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("speedup n/a"), "{err}");
    assert!(err.match_indices("speedup ").all(|(i, _)| err[i + 8..].starts_with("n/a")), "{err}");
}

#[test]
fn train_target_checks_every_flag_before_reading_the_corpus() {
    let sc = Scratch::create("train-target-flags");
    let home = sc.join("home");
    let out = sc.join("out");
    for (flags, needle) in [
        (&["--lr", "nan"][..], "--lr NaN"),
        (&["--lr", "0"], "--lr 0"),
        (&["--seq-len", "1"], "--seq-len 1"),
        (&["--batch", "0"], "--batch 0"),
        (&["--steps", "0"], "--steps 0"),
        (&["--hidden", "0"], "hidden must be at least 1"),
        (&["--layers", "0"], "layers must be at least 1"),
        (&["--window", "0"], "window must be at least 1"),
        (&["--heads", "3"], "multiple of heads 3"),
        (&["--vocab", "100"], "--vocab 100"),
    ] {
        let r = dspark(&home, &[&["train-target", "--out", s(&out)][..], flags].concat());
        fails_with(&r, &[needle]);
        assert!(!String::from_utf8_lossy(&r.stderr).contains("corpus"), "{flags:?} read the corpus first");
        assert!(!out.exists());
    }
}

#[test]
fn the_default_drafter_quantizes_with_its_default_group_size() {
    let sc = Scratch::create("quantize-default");
    let home = sc.join("home");
    let r = dspark(&home, &["init-default"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let stdout = String::from_utf8_lossy(&r.stdout).to_string();
    let drafter = PathBuf::from(stdout.lines().nth(1).expect("the drafter's path"));
    let out = sc.join("q8");
    let r = dspark(&home, &["quantize-drafter", "--src", s(&drafter), "--out", s(&out), "--bits", "8"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("markov.w1") && err.contains("group size 32"), "{err}");
    assert!(out.join("dspark.json").is_file());
}

/// A copy of the `dspark` binary alone in a directory (hard-linked where the filesystem allows),
/// so that what sits beside it is up to the test.
fn lone_dspark(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("dir");
    let bin = dir.join("dspark");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_dspark"), &bin).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_dspark"), &bin).expect("copy dspark");
    }
    bin
}

#[cfg(unix)]
#[test]
fn serve_runs_dspark_serve_beside_it_with_the_same_arguments() {
    use std::os::unix::fs::PermissionsExt;
    let sc = Scratch::create("cli-serve-exec");
    let bin = lone_dspark(&sc.join("bin"));
    let args = ["serve", "--help", "--port", "0", "--drafter", "a dir"];
    // Without dspark-serve, the message says how to build it.
    let r = Command::new(&bin).args(args).env("DSPARK_HOME", sc.join("home")).output().expect("run dspark");
    fails_with(&r, &["dspark-serve", "cargo build --release -p dspark-serve"]);
    // A stand-in that prints its arguments, one per line, and exits with a code of its own.
    let server = sc.join("bin/dspark-serve");
    std::fs::write(&server, "#!/bin/sh\nprintf '%s\\n' \"$@\"\nexit 3\n").expect("write stand-in");
    std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let r = Command::new(&bin).args(args).env("DSPARK_HOME", sc.join("home")).output().expect("run dspark");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "--help\n--port\n0\n--drafter\na dir\n");
    assert_eq!(r.status.code(), Some(3), "the server's exit status is dspark's");
}
