//! `cargo xtask gates --only serve`: `dspark-serve` on the embedded default against the
//! official `openai` Python client. The texts `dspark generate` prints for a few prompts
//! (completion and chat, greedy and seeded sampling) are the reference; the server, launched on
//! a free port, must answer each of them with exactly that text, whole and streamed. Then
//! malformed requests must get 400s, and a load test (32 clients × 4 requests, mixed, some
//! disconnecting mid-stream) must leave every completed response correct, the server healthy
//! and idle, and its RSS reported before and after. The server must then shut down cleanly on
//! SIGTERM. A second server, on the tool-calling chat fixture (`train::tool_chat`, trained
//! once and cached under target/tmp), is driven through the client's tools API: calls whole and
//! streamed, a tool result answered, thinking separated, usage once per stream. Token counts
//! are small: the whole gate takes about a minute on 2 cores (plus a minute the first time the
//! fixture trains).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The `openai` client version the gate is pinned to.
pub const OPENAI: &str = "openai==3.51.0";

struct Case {
    name: &'static str,
    prompt: &'static str,
    chat: bool,
    params: Value,
}

fn cases() -> Vec<Case> {
    let greedy = json!({"max_tokens": 16, "temperature": 0.0});
    let sampled = json!({"max_tokens": 16, "temperature": 0.8, "top_p": 0.9, "seed": 7});
    let filtered = json!({"max_tokens": 16, "temperature": 1.0, "top_k": 20, "min_p": 0.05, "seed": 3});
    vec![
        Case { name: "completion-greedy", prompt: "def fibonacci(n):", chat: false, params: greedy.clone() },
        Case { name: "completion-sampled", prompt: "import os\nimport sys\n", chat: false, params: sampled.clone() },
        Case { name: "completion-topk-minp", prompt: "class Stack:", chat: false, params: filtered },
        Case { name: "chat-greedy", prompt: "read a file line by line", chat: true, params: greedy },
        Case { name: "chat-sampled", prompt: "parse a date", chat: true, params: sampled },
    ]
}

/// Kills the server if the gate fails half way.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the binary of `package` (named as the package; `release`: optimized) and returns its
/// path.
pub(crate) fn workspace_binary(workspace: &Path, package: &str, release: bool) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec!["build", "--quiet", "-p", package];
    if release {
        args.push("--release");
    }
    let status = Command::new(cargo)
        .args(&args)
        .current_dir(workspace)
        .status()
        .with_context(|| format!("building {package}"))?;
    if !status.success() {
        bail!("building {package} failed with {status}");
    }
    let profile = if release { "release" } else { "debug" };
    let bin = crate::target_dir().join(profile).join(format!("{package}{}", std::env::consts::EXE_SUFFIX));
    if !bin.is_file() {
        bail!("{} was not built", bin.display());
    }
    Ok(bin)
}

/// What `dspark generate` prints for a case (its stdout, less the final newline).
fn reference(bin: &Path, home: &Path, c: &Case) -> Result<String> {
    let p = &c.params;
    let mut cmd = Command::new(bin);
    cmd.env("DSPARK_HOME", home).args(["generate", "--drafter", "default", "--prompt", c.prompt]);
    cmd.arg("--max-tokens").arg(p["max_tokens"].to_string());
    cmd.arg("--temperature").arg(p["temperature"].to_string());
    for (k, flag) in [("top_p", "--top-p"), ("top_k", "--top-k"), ("min_p", "--min-p"), ("seed", "--seed")] {
        if let Some(v) = p.get(k) {
            cmd.arg(flag).arg(v.to_string());
        }
    }
    if c.chat {
        cmd.arg("--chat");
    }
    let out = cmd.stderr(Stdio::inherit()).output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed with {}", out.status);
    }
    let text = String::from_utf8(out.stdout).context("dspark generate printed non-UTF-8")?;
    Ok(text.strip_suffix('\n').unwrap_or(&text).to_string())
}

/// Starts `dspark-serve` with `model_args` on a free port and returns it with its base URL.
fn launch(server_bin: &Path, home: &Path, model_args: &[&str]) -> Result<(Server, String)> {
    let mut child = Command::new(server_bin)
        .env("DSPARK_HOME", home)
        .args(model_args)
        .args(["--host", "127.0.0.1", "--port", "0", "--max-concurrency", "4"])
        // `dspark generate`'s prefill grid, so long prompts are prefilled in the same chunks.
        .args(["--prefill-step", "2048"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting dspark-serve")?;
    let stdout = child.stdout.take().context("the server's stdout")?;
    let server = Server(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(std::io::Result::ok) {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx.recv_timeout(Duration::from_secs(180)).context("dspark-serve did not start listening in 180 s")?;
    Ok((server, url))
}

/// Runs the gate; `root` holds its files (the default model's home, the cases).
pub fn serve_gate(root: &Path, venv: &Path) -> Result<()> {
    let t0 = Instant::now();
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = crate::venv::ensure_with(venv, &[OPENAI])?;
    let bin = workspace_binary(&workspace, "dspark", false)?;
    let server_bin = workspace_binary(&workspace, "dspark-serve", false)?;
    let home = root.join("home");
    std::fs::create_dir_all(&home)?;
    let mut list = Vec::new();
    for c in cases() {
        let expected = reference(&bin, &home, &c)?;
        if expected.is_empty() {
            bail!("{}: dspark generate printed nothing; the comparison would be vacuous", c.name);
        }
        list.push(
            json!({"name": c.name, "prompt": c.prompt, "chat": c.chat, "params": c.params, "expected": expected}),
        );
    }
    let cases_path = root.join("cases.json");
    std::fs::write(&cases_path, serde_json::to_vec_pretty(&list)?)?;

    let (mut server, url) = launch(&server_bin, &home, &["--drafter", "default"])?;
    eprintln!("serve gate: server at {url}");
    let script = workspace.join("xtask/py/serve_client.py");
    let status = Command::new(&python)
        .arg(&script)
        .arg(&url)
        .arg(&cases_path)
        .arg(server.0.id().to_string())
        .args(["32", "4"])
        .status()
        .context("running the openai client")?;
    if !status.success() {
        bail!("the serve gate's client checks failed ({status}); see above");
    }
    terminate(&mut server)?;

    // Tool calling on a checkpoint that speaks Gemma-4's chat format.
    let fixture = train::tool_chat::cached_tool_chat_checkpoint(&crate::target_dir().join("tmp"))?;
    let tools_path = root.join("tools.json");
    std::fs::write(&tools_path, serde_json::to_vec_pretty(&train::tool_chat::tools())?)?;
    let model = fixture.to_string_lossy().into_owned();
    let (mut server, url) = launch(&server_bin, &home, &["--model", &model, "--drafter", "none"])?;
    let status = Command::new(&python)
        .arg(workspace.join("xtask/py/tool_client.py"))
        .arg(&url)
        .arg(&tools_path)
        .status()
        .context("running the openai tools client")?;
    if !status.success() {
        bail!("the serve gate's tool-calling checks failed ({status}); see above");
    }
    terminate(&mut server)?;
    eprintln!("serve gate: passed in {:.0} s (servers shut down cleanly on SIGTERM)", t0.elapsed().as_secs_f64());
    Ok(())
}

/// Graceful shutdown on SIGTERM: the server must exit by itself, successfully.
fn terminate(server: &mut Server) -> Result<()> {
    let kill = Command::new("kill").arg("-TERM").arg(server.0.id().to_string()).status()?;
    if !kill.success() {
        bail!("could not send SIGTERM to the server");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(s) = server.0.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            bail!("the server did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if !exit.success() {
        bail!("the server exited with {exit} after SIGTERM");
    }
    Ok(())
}
