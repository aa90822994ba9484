//! `cargo xtask bench --serve`: the real servers over HTTP under concurrent load. Launches
//! `dspark-serve` on the embedded default pair three ways (plain, speculative with full blocks,
//! speculative with the throughput schedule; f32 `auto`, plus the scheduled one in bf16
//! `--dtype stored`) and mlx-lm's own server on the same checkpoint, all at once on free ports,
//! then for 1, 4, 16 and 32 clients (streamed 128-token `/v1/completions` requests on held-out
//! prompts), greedy and T = 1, drives each server in turn with the same load
//! (`xtask/py/serve_load.py`), interleaved. Reports aggregate generated tok/s, time to first
//! token and inter-chunk gaps (p50/p95), errors, each server's RSS, and whether greedy outputs
//! under load equal the one-client outputs; writes serve.json and serve.png (aggregate tok/s
//! by concurrency).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// A server under test; killed when dropped.
struct Server {
    name: String,
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Waits until `url`/v1/models answers (a server that loads its model first).
fn wait_ready(url: &str, child: &mut Child, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let addr = url.trim_start_matches("http://").to_string();
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited with {status} before it was ready");
        }
        if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            if s.read_exact(&mut head).is_ok()
                && (head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200"))
            {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!("{name} did not answer /v1/models within 300 s")
}

fn dspark(bin: &Path, home: &Path, name: &str, args: &[&str]) -> Result<Server> {
    let port = free_port()?;
    let mut child = Command::new(bin)
        .env("DSPARK_HOME", home)
        .args(args)
        .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--max-concurrency", "32"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url, &mut child, name)?;
    Ok(Server { name: name.into(), child, url })
}

fn mlx_lm(python: &Path, model: &Path) -> Result<Server> {
    let port = free_port()?;
    let name = "mlx-lm server (bf16)";
    let mut child = Command::new(python)
        .args(["-m", "mlx_lm.server", "--model"])
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting mlx-lm's server")?;
    // Its log is read (and dropped) so a full pipe never blocks it.
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || for _ in BufReader::new(err).lines().map_while(std::io::Result::ok) {});
    }
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url, &mut child, name)?;
    Ok(Server { name: name.into(), child, url })
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn percentile(v: &[f64], q: f64) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| s[((s.len() - 1) as f64 * q).round() as usize])
}

/// `dspark profile` of the default pair in `home` for `dtype` (`auto` or `stored`), so the
/// scheduled servers have their verify and batch cost curves.
fn profile(dspark_bin: &Path, home: &Path, dtype: &str) -> Result<()> {
    let out = Command::new(dspark_bin)
        .env("DSPARK_HOME", home)
        .args(["profile", "--dtype", dtype])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .context("running dspark profile")?;
    if !out.success() {
        bail!("dspark profile --dtype {dtype} failed with {out}");
    }
    Ok(())
}

/// Runs the benchmark; `quick`: 1 and 4 clients, 32-token requests, no mid-size rows.
pub fn run(root: &Path, venv: &Path, quick: bool) -> Result<Value> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let server_bin = crate::serve_gate::workspace_binary(&workspace, "dspark-serve", true)?;
    let dspark_bin = crate::serve_gate::workspace_binary(&workspace, "dspark", true)?;
    let python = crate::venv::ensure(venv)?;
    let model = engine::default_model::ensure(false)?;
    let home = root.join("home");
    std::fs::create_dir_all(&home)?;
    let prompts: Vec<String> = crate::train_default::test_prompts(16)?.into_iter().map(|p| p.text).collect();
    let prompts_path = root.join("serve_prompts.json");
    std::fs::write(&prompts_path, serde_json::to_vec(&prompts)?)?;
    let (levels, max_tokens): (&[usize], usize) = if quick { (&[1, 4], 32) } else { (&[1, 4, 16, 32], 128) };

    eprintln!("bench --serve: profiling the default pair (f32 and bf16) for the schedules");
    profile(&dspark_bin, &home, "auto")?;
    profile(&dspark_bin, &home, "stored")?;
    eprintln!("bench --serve: starting the servers");
    let servers = [
        dspark(&server_bin, &home, "dspark plain", &["--drafter", "none"])?,
        dspark(&server_bin, &home, "dspark speculative, full blocks", &["--drafter", "default", "--schedule", "full"])?,
        dspark(&server_bin, &home, "dspark speculative, schedule", &["--drafter", "default", "--schedule", "auto"])?,
        dspark(
            &server_bin,
            &home,
            "dspark speculative, schedule, bf16",
            &["--drafter", "default", "--schedule", "auto", "--dtype", "stored"],
        )?,
        mlx_lm(&python, &model)?,
    ];
    let script = workspace.join("xtask/py/serve_load.py");
    let load = Load { python: &python, script: &script, prompts: &prompts_path, n_prompts: prompts.len() };
    println!("\n### default pair ({max_tokens}-token streamed requests, {} prompts per level)\n", prompts.len());
    let rows = load.drive(&servers, levels, max_tokens, &[("greedy", 0.0), ("T=1", 1.0)])?;
    drop(servers);
    let png = root.join("serve.png");
    let title = format!("aggregate generated tok/s by concurrency ({max_tokens}-token streamed requests)");
    if plot(&png, &title, &rows)? {
        println!("wrote {}", png.display());
    }

    // The mid-size random checkpoint, plain decoding only: where batching pays for itself on
    // weights that no longer fit the caches.
    let mut mid_rows = Vec::new();
    if !quick {
        let (_, mid) = crate::bench::mid_checkpoint(root, false)?;
        let mid_prompts: Vec<String> = (0..16)
            .map(|i| (0..48).map(|j| format!("t{}", 5 + (i * 131 + j * 17) % 900)).collect::<Vec<_>>().join(" "))
            .collect();
        let mid_path = root.join("serve_prompts_mid.json");
        std::fs::write(&mid_path, serde_json::to_vec(&mid_prompts)?)?;
        let mid_dir = mid.to_string_lossy().into_owned();
        let servers =
            [dspark(&server_bin, &home, "dspark plain, mid-size", &["--model", &mid_dir, "--drafter", "none"])?];
        let load = Load { python: &python, script: &script, prompts: &mid_path, n_prompts: mid_prompts.len() };
        println!(
            "\n### mid-size random checkpoint (32-token streamed requests, {} prompts per level)\n",
            mid_prompts.len()
        );
        mid_rows = load.drive(&servers, &[1, 4, 16], 32, &[("greedy", 0.0)])?;
    }
    Ok(
        json!({"max_tokens": max_tokens, "prompts": prompts.len(), "levels": levels, "rows": rows, "mid_size": mid_rows}),
    )
}

/// Aggregate tok/s by concurrency, one line per server and sampling.
fn plot(png: &Path, title: &str, rows: &[Value]) -> Result<bool> {
    let mut names: Vec<(String, String)> = Vec::new();
    for r in rows {
        let key = (r["server"].as_str().unwrap_or("").to_string(), r["sampling"].as_str().unwrap_or("").to_string());
        if !names.contains(&key) {
            names.push(key);
        }
    }
    let series: Vec<dspark::plot::Series> = names
        .iter()
        .map(|(name, m)| dspark::plot::Series {
            label: format!("{name}, {m}"),
            points: rows
                .iter()
                .filter(|r| r["server"] == name.as_str() && r["sampling"] == m.as_str())
                .filter_map(|r| Some((r["clients"].as_f64()?, r["tok_per_s"].as_f64()?)))
                .collect(),
        })
        .collect();
    dspark::plot::lines(png, title, ("concurrent clients", "tok/s, all clients"), &series, true)
}

/// The load client and its prompts.
struct Load<'a> {
    python: &'a Path,
    script: &'a Path,
    prompts: &'a Path,
    n_prompts: usize,
}

impl Load<'_> {
    /// Every level of concurrency against every server in turn, for each sampling; prints a
    /// table and returns its rows.
    fn drive(
        &self,
        servers: &[Server],
        levels: &[usize],
        max_tokens: usize,
        samplings: &[(&str, f64)],
    ) -> Result<Vec<Value>> {
        let mut rows = Vec::new();
        println!("| sampling | clients | server | tok/s | vs 1 client | TTFT p50 ms | gap p50 ms | gap p95 ms | errors | greedy = 1 client |");
        println!("|---|---|---|---|---|---|---|---|---|---|");
        for &(sampling, temperature) in samplings {
            // Per server: tok/s at one client, and the one-client greedy texts by prompt.
            let mut base: Vec<(f64, Vec<(u64, String)>)> = vec![(0.0, Vec::new()); servers.len()];
            for &clients in levels {
                for (si, s) in servers.iter().enumerate() {
                    // Enough requests that every prompt is asked at least once per level.
                    let requests = self.n_prompts.div_ceil(clients).max(1);
                    let out = Command::new(self.python)
                        .arg(self.script)
                        .arg(&s.url)
                        .arg(self.prompts)
                        .args([
                            clients.to_string(),
                            requests.to_string(),
                            max_tokens.to_string(),
                            temperature.to_string(),
                        ])
                        .stderr(Stdio::inherit())
                        .output()
                        .context("running the load client")?;
                    if !out.status.success() {
                        bail!("the load client failed against {} ({})", s.name, out.status);
                    }
                    let r: Value = serde_json::from_slice(&out.stdout).context("the load client's report")?;
                    let f = |k: &str| r[k].as_array().map(|a| a.iter().filter_map(Value::as_f64).collect::<Vec<_>>());
                    let (ttft, gaps) = (f("ttft").unwrap_or_default(), f("gaps").unwrap_or_default());
                    let tok_s = r["tokens"].as_f64().unwrap_or(0.0) / r["wall_s"].as_f64().unwrap_or(1.0).max(1e-9);
                    let errors = r["errors"].as_array().map_or(0, Vec::len);
                    let mut texts: Vec<(u64, String)> = r["outputs"]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|o| Some((o["prompt"].as_u64()?, o["text"].as_str()?.to_string())))
                                .collect()
                        })
                        .unwrap_or_default();
                    texts.sort();
                    texts.dedup();
                    if clients == levels[0] {
                        base[si] = (tok_s, texts.clone());
                    }
                    // Greedy text must not depend on what else is being decoded.
                    let exact = (temperature == 0.0 && s.name.starts_with("dspark"))
                        .then(|| texts.iter().all(|(p, t)| base[si].1.iter().any(|(bp, bt)| bp == p && bt == t)));
                    let ms = |v: Option<f64>| v.map_or_else(|| "-".into(), |x| format!("{:.0}", x * 1e3));
                    println!(
                        "| {sampling} | {clients} | {} | {tok_s:.1} | {:.2}× | {} | {} | {} | {errors} | {} |",
                        s.name,
                        tok_s / base[si].0.max(1e-9),
                        ms(percentile(&ttft, 0.5)),
                        ms(percentile(&gaps, 0.5)),
                        ms(percentile(&gaps, 0.95)),
                        exact.map_or("-", |e| if e { "yes" } else { "NO" }),
                    );
                    rows.push(json!({"sampling": sampling, "clients": clients, "server": s.name, "tok_per_s": tok_s,
                                     "ttft_p50_s": percentile(&ttft, 0.5), "ttft_p95_s": percentile(&ttft, 0.95),
                                     "gap_p50_s": percentile(&gaps, 0.5), "gap_p95_s": percentile(&gaps, 0.95),
                                     "errors": r["errors"], "greedy_equals_one_client": exact,
                                     "rss_mib": rss_mib(s.child.id())}));
                }
            }
        }
        Ok(rows)
    }
}
