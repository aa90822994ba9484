//! `dspark train` refuses bad flags and misuse of --out before loading anything.

use std::process::Command;

fn dspark(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dspark")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn train_refuses_bad_flags_and_an_occupied_out() {
    let root = std::env::temp_dir().join(format!("dspark-train-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let out = root.join("run");
    std::fs::create_dir_all(out.join("best")).unwrap();
    let (m, d, o) = (root.join("model"), root.join("data"), out.to_str().unwrap().to_string());
    let base = ["train", "--model", m.to_str().unwrap(), "--data", d.to_str().unwrap(), "--out", &o];
    let run = |extra: &[&str]| dspark(&[&base[..], extra].concat());
    let (ok, e) = run(&["--heads", "3"]);
    assert!(!ok && e.contains("--heads 3 does not divide --d-model 128"), "{e}");
    let (ok, e) = run(&["--lr", "-1"]);
    assert!(!ok && e.contains("'-1' for '--lr") && e.contains("greater than 0"), "{e}");
    let (ok, e) = run(&[]);
    assert!(!ok && e.contains("already holds a training run") && e.contains("--resume"), "{e}");
    let (ok, e) = run(&["--resume"]);
    assert!(!ok && e.contains("no saved state"), "{e}");
    let (ok, e) = run(&["--resume", "--force"]);
    assert!(!ok && e.contains("cannot be used with"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
