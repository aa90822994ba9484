//! The `dspark-serve` binary: bad flags are refused before anything loads, naming the flag; a
//! good command line serves until SIGTERM and then exits cleanly.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use engine::testing::target_dir;
use gemma4::testing::Scratch;

fn server(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dspark-serve"));
    cmd.env("DSPARK_HOME", home);
    cmd
}

/// Asserts the run failed with a message containing every one of `needles`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
}

#[test]
fn bad_serving_flags_are_refused_before_anything_loads() {
    let home = Scratch::create("serve-cli-flags");
    for (args, needle) in [
        (&["--max-concurrency", "0"][..], "--max-concurrency"),
        (&["--prefill-step", "0"], "--prefill-step"),
        (&["--drafter", "none", "--gamma", "2"], "--drafter"),
        (&["--schedule", "throughput"], "pass auto or full"),
        (&["--port", "70000"], "--port"),
    ] {
        let r = server(&home).args(args).output().expect("run dspark-serve");
        fails_with(&r, &[needle]);
    }
    // Refused before the embedded default was written.
    assert!(std::fs::read_dir(&*home).expect("home").next().is_none(), "the default model was written");
}

#[cfg(unix)]
#[test]
fn serves_until_sigterm_and_exits_cleanly() {
    let home = Scratch::create("serve-cli-run");
    let mut child = server(&home)
        .args(["--model", target_dir().to_str().expect("utf-8"), "--drafter", "none", "--port", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start dspark-serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read stdout");
    let addr = line.trim().rsplit("http://").next().expect("an address").to_string();
    assert!(line.contains("listening on"), "{line}");
    let mut conn = std::net::TcpStream::connect(&addr).expect("connect");
    conn.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").expect("send");
    let mut resp = String::new();
    conn.read_to_string(&mut resp).expect("read response");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("\"status\":\"ok\""), "{resp}");
    let kill = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}
