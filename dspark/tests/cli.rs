//! The `dspark` binary's refusals: each bad command line must fail with a message naming the
//! flag, and leave every file as it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use mlx_core::Dtype;

/// A scratch directory (canonical, so path comparisons hold) removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("dspark-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Scratch(dir.canonicalize().expect("canonical scratch"))
    }

    fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny random target (tiny config A, with a tokenizer) in `dir`.
fn write_target(dir: &Path) -> PathBuf {
    write_random_checkpoint(dir, &tiny_config_a(), 3, Dtype::Bf16, 1, false).expect("target")
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
    let sc = Scratch::new("qt-out");
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
    let sc = Scratch::new("qt-ok");
    let model = write_target(&sc.join("model"));
    let out = sc.join("model-q8");
    let r = dspark(&sc.join("home"), &["quantize-target", "--model", s(&model), "--out", s(&out), "--bits", "8"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(out.join("config.json").is_file());
}
