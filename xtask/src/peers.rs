//! `cargo xtask bench --peers`: dspark against llama.cpp, the runtime CPU users pick, and
//! mlx-lm, on this machine, in one run. Optional and never in CI: the first run builds
//! llama.cpp (~45 minutes on 2 cores, `xtask/peers/llama.sh`) unless `LLAMA_CPP_DIR` names a
//! build, and installs its converter's Python packages (torch among them, ~4 GB) into
//! `target/peers/convert-venv`.
//!
//! Checkpoints: the embedded default (6.8M) and the mid-size random checkpoint (230M), each
//! converted to GGUF f32 by llama.cpp's own converter (`xtask/peers/to_gguf.py`) and quantized
//! to q8_0 and q4_0 by `llama-quantize`. llama.cpp is timed by `llama-bench` (pp512 / tg128,
//! 2 threads and 1); dspark by its library (plain decode from an 8-token prompt and prefill of
//! 512 tokens, as llama-bench does; f32, and for the mid-size checkpoint its 8-bit and 4-bit
//! copies kept packed); speculative decoding of the default pair (the engine session under
//! `auto`, what `dspark generate` runs, and full blocks) and llama.cpp's n-gram `llama-lookup`
//! on held-out prompts, beside plain decoding of the same prompts. Every case is run `passes`
//! times, interleaved, and the median pass is reported. Writes `peers.json` and `peers.png`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gemma4::generate::generate;
use gemma4::sampling::SamplerConfig;
use gemma4::{ComputeDtype, Model};
use mlx_core::Device;
use serde_json::{json, Value};

use crate::bench::{median, ours_speed, reference_speed, Plan};

/// The converter's Python packages (torch's CUDA wheels come with it: PyPI has no CPU-only
/// build; they load fine on a machine without a GPU).
const CONVERT_PACKAGES: [&str; 6] =
    ["torch==2.11.0", "transformers==5.25.0", "numpy", "safetensors", "sentencepiece", "protobuf"];
const TOOLS: [&str; 4] = ["llama-bench", "llama-quantize", "llama-lookup", "llama-completion"];

/// A llama.cpp build: its tools and its source tree (converter, gguf-py).
struct Llama {
    bin: PathBuf,
    src: PathBuf,
}

impl Llama {
    /// `LLAMA_CPP_DIR` (a llama.cpp checkout or llama.sh's layout, with `build/bin` or `bin`),
    /// else `target/peers/llama`, built there by llama.sh on first use.
    fn find(target: &Path) -> Result<Llama> {
        let dir = match std::env::var_os("LLAMA_CPP_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let dir = target.join("peers/llama");
                if !dir.join(".built").is_file() {
                    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/llama.sh");
                    eprintln!("bench: building llama.cpp into {} (about 45 minutes on 2 cores, once)", dir.display());
                    let status = Command::new("bash").arg(&script).arg(&dir).status().context("running llama.sh")?;
                    if !status.success() {
                        bail!("{} failed ({status}); set LLAMA_CPP_DIR to an existing build instead", script.display());
                    }
                }
                dir
            }
        };
        let bin = ["build/bin", "bin"].iter().map(|b| dir.join(b)).find(|b| b.join(TOOLS[0]).is_file());
        let src = ["src", "."].iter().map(|s| dir.join(s)).find(|s| s.join("convert_hf_to_gguf.py").is_file());
        match (bin, src) {
            (Some(bin), Some(src)) => {
                for tool in TOOLS {
                    if !bin.join(tool).is_file() {
                        bail!("llama.cpp at {}: {} has no {tool}", dir.display(), bin.display());
                    }
                }
                Ok(Llama { bin, src })
            }
            _ => bail!(
                "LLAMA_CPP_DIR={}: expected llama.cpp tools in build/bin or bin and convert_hf_to_gguf.py in src or the top",
                dir.display()
            ),
        }
    }

    fn tool(&self, name: &str) -> Command {
        Command::new(self.bin.join(name))
    }
}

/// The GGUF files of one checkpoint: f32 from the converter, q8_0 and q4_0 from llama-quantize.
fn ggufs(llama: &Llama, python: &Path, checkpoint: &Path, dir: &Path, name: &str) -> Result<Vec<(String, PathBuf)>> {
    std::fs::create_dir_all(dir)?;
    let f32 = dir.join(format!("{name}-f32.gguf"));
    if !f32.is_file() {
        eprintln!("bench: converting {} to {}", checkpoint.display(), f32.display());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/to_gguf.py");
        let out = Command::new(python).arg(&script).arg(&llama.src).arg(checkpoint).arg(&f32).output()?;
        if !out.status.success() {
            bail!("converting {} to GGUF failed:\n{}", checkpoint.display(), tail(&out.stderr, 3000));
        }
    }
    let mut files = vec![("f32".to_string(), f32.clone())];
    for q in ["q8_0", "q4_0"] {
        let path = dir.join(format!("{name}-{q}.gguf"));
        if !path.is_file() {
            let part = path.with_extension("gguf.part");
            let out = llama.tool("llama-quantize").arg(&f32).arg(&part).arg(q.to_uppercase()).output()?;
            if !out.status.success() {
                bail!("llama-quantize {} {q} failed:\n{}", f32.display(), tail(&out.stderr, 3000));
            }
            std::fs::rename(&part, &path)?;
        }
        files.push((q.to_string(), path));
    }
    Ok(files)
}

fn tail(bytes: &[u8], n: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// llama-bench pp512 / tg128 at `threads` on one file: (decode tok/s, prefill tok/s).
fn llama_bench(llama: &Llama, gguf: &Path, threads: usize, reps: usize) -> Result<(f64, f64)> {
    let out = llama
        .tool("llama-bench")
        .arg("-m")
        .arg(gguf)
        .args(["-p", "512", "-n", "128", "-t", &threads.to_string(), "-r", &reps.to_string(), "-o", "json"])
        .output()
        .context("running llama-bench")?;
    if !out.status.success() {
        bail!("llama-bench on {} failed:\n{}", gguf.display(), tail(&out.stderr, 3000));
    }
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).context("parsing llama-bench's json")?;
    let rate = |gen: bool| {
        rows.iter()
            .find(|r| (r["n_gen"].as_u64().unwrap_or(0) > 0) == gen)
            .and_then(|r| r["avg_ts"].as_f64())
            .with_context(|| format!("llama-bench on {}: no {} row", gguf.display(), if gen { "tg" } else { "pp" }))
    };
    Ok((rate(true)?, rate(false)?))
}

/// llama-lookup (n-gram prompt lookup, greedy) on `prompt`: (decode tok/s, drafted, accepted).
/// Build 11434's llama-lookup now and then exits with status 0 right after setting up its
/// threads, printing nothing (seen about once in 50 runs here): such a run is retried.
fn llama_lookup(llama: &Llama, gguf: &Path, prompt: &str, tokens: usize) -> Result<(f64, u64, u64)> {
    let mut tries = 0;
    loop {
        match lookup_once(llama, gguf, prompt, tokens) {
            Err(e) if tries < 3 && e.to_string().starts_with(NO_STATS) => {
                tries += 1;
                eprintln!("bench: llama-lookup printed no statistics; running it again");
            }
            r => return r,
        }
    }
}

const NO_STATS: &str = "llama-lookup: no speed";

fn lookup_once(llama: &Llama, gguf: &Path, prompt: &str, tokens: usize) -> Result<(f64, u64, u64)> {
    let out = llama
        .tool("llama-lookup")
        .arg("-m")
        .arg(gguf)
        .args(["-p", prompt, "-n", &tokens.to_string(), "-t", "2", "--temp", "0", "--spec-draft-n-max", "3"])
        .output()
        .context("running llama-lookup")?;
    // The statistics are logged on stderr (the text goes to stdout).
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        bail!("llama-lookup on {} failed:\n{}", gguf.display(), tail(&out.stderr, 3000));
    }
    let number_after = |key: &str| -> Option<f64> {
        let rest = &log[log.rfind(key)? + key.len()..];
        let rest = rest.trim_start_matches([' ', '=', ':']);
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?.parse().ok()
    };
    match (number_after("speed:"), number_after("n_drafted"), number_after("n_accept")) {
        (Some(speed), Some(drafted), Some(accepted)) => Ok((speed, drafted as u64, accepted as u64)),
        _ => bail!("{NO_STATS} / n_drafted / n_accept in its log:\n{}", tail(&out.stderr, 2000)),
    }
}

/// llama.cpp's greedy continuation of `prompt` (`tokens` tokens, end of text ignored), as text.
fn llama_greedy_text(llama: &Llama, gguf: &Path, prompt: &str, tokens: usize) -> Result<String> {
    let out = llama
        .tool("llama-completion")
        .arg("-m")
        .arg(gguf)
        .args(["-p", prompt, "-n", &tokens.to_string(), "-t", "2", "--temp", "0", "--ignore-eos"])
        .args(["-no-cnv", "--no-display-prompt", "--simple-io", "--no-warmup"])
        .output()
        .context("running llama-completion")?;
    if !out.status.success() {
        bail!("llama-completion on {} failed:\n{}", gguf.display(), tail(&out.stderr, 3000));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// One row of the table: a runtime on a checkpoint's weights, its tok/s per pass.
struct Row {
    checkpoint: &'static str,
    runtime: String,
    weights: String,
    threads: usize,
    decode: Vec<f64>,
    prefill: Vec<f64>,
}

impl Row {
    fn new(checkpoint: &'static str, runtime: &str, weights: &str, threads: usize) -> Row {
        Row { checkpoint, runtime: runtime.into(), weights: weights.into(), threads, decode: vec![], prefill: vec![] }
    }
    fn label(&self) -> String {
        format!("{} {} -t {}", self.runtime, self.weights, self.threads)
    }
}

/// Decode tok/s over held-out prompts (prefill excluded): plain `generate`, the engine session
/// under `auto` and full-block speculative decoding, with greedy outputs checked equal.
fn default_speculative(
    model: &Model,
    drafter: &mut (dyn spec_decode::Drafter + 'static),
    ids: &[Vec<u32>],
    tokens: usize,
) -> Result<(f64, f64, f64, f64)> {
    let (mut plain, mut auto, mut full, mut tau) = (0.0, 0.0, 0.0, spec_decode::SpecStats::default());
    let mut n = 0usize;
    for (i, prompt) in ids.iter().enumerate() {
        let cfg = crate::bench::held_out_config(tokens, &SamplerConfig::greedy(), i);
        let g = generate(model, prompt, &cfg, |_| {})?;
        plain += g.stats.decode_ms;
        n += g.tokens.len();
        let sc = spec_decode::SpecConfig { generate: cfg.clone(), gamma: None, pruning: spec_decode::Pruning::Off };
        let s = spec_decode::speculative_generate(model, &mut *drafter, prompt, &sc, |_| {})?;
        full += s.stats.decode_ms;
        tau.absorb(&s.stats);
        let req = crate::bench::auto_request(prompt, &cfg);
        let session = engine::Session::start(model, Some(&mut *drafter), &req, None, None)?;
        let t = Instant::now();
        let out = session.run(Some(&mut *drafter), |_| {})?;
        auto += t.elapsed().as_secs_f64() * 1e3;
        if s.tokens != g.tokens || out.tokens != g.tokens {
            bail!("held-out prompt {i}: greedy speculative output differs from plain decoding");
        }
    }
    let rate = |ms: f64| n as f64 / (ms / 1e3).max(1e-9);
    Ok((rate(plain), rate(auto), rate(full), tau.tau()))
}

pub fn run(root: &Path, target: &Path, passes: usize) -> Result<Value> {
    std::fs::create_dir_all(root)?;
    let llama = Llama::find(target)?;
    let python = crate::venv::ensure_with(&target.join("peers/convert-venv"), &CONVERT_PACKAGES)?;
    let reference = crate::venv::ensure(&target.join("reference-venv"))?;
    let default = engine::default_model::ensure(false)?;
    let ddir = engine::default_model::ensure_drafter(false)?;
    let (_, mid) = crate::bench::mid_checkpoint(&target.join("bench"), false)?;
    let (q8, q4) = (crate::steps::quantized(&mid, 8)?, crate::steps::quantized(&mid, 4)?);
    let gguf_dir = target.join("peers/gguf");
    let default_gguf = ggufs(&llama, &python, &default, &gguf_dir, "default")?;
    let mid_gguf = ggufs(&llama, &python, &mid, &gguf_dir, "mid")?;

    let cpu = Device::Cpu;
    let (default_model, _) = Model::load_as(&default, ComputeDtype::Auto, cpu)?;
    let mids = [
        ("f32", Model::load_as(&mid, ComputeDtype::Auto, cpu)?.0),
        ("8-bit", Model::load_as(&q8, ComputeDtype::Auto, cpu)?.0),
        ("4-bit", Model::load_as(&q4, ComputeDtype::Auto, cpu)?.0),
    ];
    let mut drafter = spec_decode::load_drafter(&ddir, default_model.config())?;
    let (prompts, ids) = crate::train_default::test_prompt_ids(&default, 8)?;
    let plan = Plan { reps: 3, decode_tokens: 128, prefill_tokens: 512 };

    // Both runtimes compute the same model: llama.cpp's greedy text from its own conversion and
    // tokenizer against dspark's.
    let tok = gemma4::tokenizer::Tokenizer::from_dir(&default)?;
    let mut same_text = 0;
    for (i, (p, prompt)) in prompts.iter().zip(&ids).enumerate() {
        let cfg = crate::bench::held_out_config(64, &SamplerConfig::greedy(), i);
        let ours = tok.decode(&generate(&default_model, prompt, &cfg, |_| {})?.tokens)?;
        let theirs = llama_greedy_text(&llama, &default_gguf[0].1, &p.text, 64)?;
        if ours.trim_end() == theirs.trim_end() {
            same_text += 1;
        } else {
            eprintln!("bench: held-out prompt {i}: llama.cpp f32's greedy text differs from dspark's:\n  dspark:    {ours:?}\n  llama.cpp: {theirs:?}");
        }
    }
    println!(
        "greedy text, 64 tokens, llama.cpp f32 against dspark: {same_text}/{} held-out prompts identical",
        ids.len()
    );

    let mut rows = Vec::new();
    for (checkpoint, files) in [("default 6.8M", &default_gguf), ("mid 230M", &mid_gguf)] {
        for (q, _) in files.iter() {
            for threads in [2, 1] {
                rows.push(Row::new(checkpoint, "llama.cpp", q, threads));
            }
        }
    }
    rows.push(Row::new("default 6.8M", "dspark", "f32", 2));
    for (w, _) in &mids {
        rows.push(Row::new("mid 230M", "dspark", w, 2));
    }
    rows.push(Row::new("default 6.8M", "mlx-lm", "f32", 2));
    rows.push(Row::new("mid 230M", "mlx-lm", "f32", 2));
    let mut held_out = Vec::new();
    let mut lookups = Vec::new();

    for pass in 0..passes {
        eprintln!("bench: peers, pass {} of {passes}", pass + 1);
        held_out.push(default_speculative(&default_model, drafter.as_mut(), &ids, 128)?);
        let mut pass_lookup = Vec::new();
        for p in &prompts {
            pass_lookup.push(llama_lookup(&llama, &default_gguf[0].1, &p.text, 128)?);
        }
        lookups.push(pass_lookup);
        for row in rows.iter_mut() {
            let (decode, prefill) = match (row.runtime.as_str(), row.checkpoint) {
                ("llama.cpp", c) => {
                    let files = if c.starts_with("default") { &default_gguf } else { &mid_gguf };
                    let file = &files.iter().find(|(q, _)| *q == row.weights).expect("a row per file").1;
                    llama_bench(&llama, file, row.threads, 2)?
                }
                ("dspark", c) if c.starts_with("default") => ours_speed(&default_model, &plan)?,
                ("dspark", _) => {
                    let model = &mids.iter().find(|(w, _)| *w == row.weights).expect("a row per model").1;
                    ours_speed(model, &Plan { reps: 1, ..plan })?
                }
                (_, c) => {
                    let (dir, vocab) = if c.starts_with("default") {
                        (&default, default_model.config().vocab_size)
                    } else {
                        (&mid, mids[0].1.config().vocab_size)
                    };
                    reference_speed(&reference, dir, true, &Plan { reps: 1, ..plan }, vocab)?
                }
            };
            eprintln!(
                "bench: {} {}: decode {decode:.1} tok/s, prefill {prefill:.0} tok/s",
                row.checkpoint,
                row.label()
            );
            row.decode.push(decode);
            row.prefill.push(prefill);
        }
    }

    // llama.cpp's median decode rate at 2 threads for one checkpoint's weights.
    let llama_decode = |checkpoint: &str, weights: &str| {
        rows.iter()
            .find(|r| r.checkpoint == checkpoint && r.runtime == "llama.cpp" && r.weights == weights && r.threads == 2)
            .map_or(f64::NAN, |r| median(r.decode.clone()))
    };
    println!("\ndecode (tg128) and prefill (pp512) tok/s, median of {passes} interleaved passes:");
    println!(
        "| checkpoint | runtime | weights | threads | decode tok/s | prefill tok/s | decode vs llama.cpp f32 -t 2 |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut table = Vec::new();
    for r in &rows {
        let (d, p) = (median(r.decode.clone()), median(r.prefill.clone()));
        let ratio = d / llama_decode(r.checkpoint, "f32");
        println!(
            "| {} | {} | {} | {} | {d:.1} | {p:.0} | {ratio:.2}× |",
            r.checkpoint, r.runtime, r.weights, r.threads
        );
        table.push(
            json!({"checkpoint": r.checkpoint, "runtime": r.runtime, "weights": r.weights, "threads": r.threads,
                          "decode_tok_per_s": d, "prefill_tok_per_s": p, "decode_passes": r.decode,
                          "prefill_passes": r.prefill, "decode_vs_llama_cpp_f32": ratio}),
        );
    }

    let pick = |f: fn(&(f64, f64, f64, f64)) -> f64| median(held_out.iter().map(f).collect());
    let (plain, auto, full, tau) = (pick(|h| h.0), pick(|h| h.1), pick(|h| h.2), pick(|h| h.3));
    let lookup_speed = median(lookups.iter().map(|l| median(l.iter().map(|x| x.0).collect())).collect());
    let (drafted, accepted) = lookups.iter().flatten().fold((0u64, 0u64), |(d, a), &(_, dr, ac)| (d + dr, a + ac));
    let (f32_ref, llama_q8) = (llama_decode("default 6.8M", "f32"), llama_decode("default 6.8M", "q8_0"));
    println!(
        "\nthe default pair on {} held-out prompts × 128 greedy tokens (decode tok/s, prefill excluded; median of {passes} passes):",
        ids.len()
    );
    println!("| decoder | tok/s | vs its plain decode | vs llama.cpp f32 (tg128) | vs llama.cpp q8_0 (tg128) |");
    println!("|---|---|---|---|---|");
    for (name, v, base) in [
        ("dspark plain (f32)", plain, plain),
        ("dspark speculative, engine auto", auto, plain),
        (&format!("dspark speculative, full blocks (τ {tau:.2})") as &str, full, plain),
        (
            &format!(
                "llama.cpp llama-lookup f32, n-gram drafts of 3 ({:.0}% accepted)",
                100.0 * accepted as f64 / drafted.max(1) as f64
            ) as &str,
            lookup_speed,
            f32_ref,
        ),
    ] {
        println!("| {name} | {v:.1} | {:.2}× | {:.2}× | {:.2}× |", v / base, v / f32_ref, v / llama_q8);
    }
    let png = root.join("peers.png");
    let bars: Vec<(String, String, f64)> = rows
        .iter()
        .filter(|r| r.threads == 2)
        .map(|r| (r.checkpoint.to_string(), format!("{} {}", r.runtime, r.weights), median(r.decode.clone())))
        .collect();
    if dspark::plot::bars(&png, "decode tok/s on this machine's CPU (2 threads)", &bars)? {
        println!("wrote {}", png.display());
    }
    Ok(json!({
        "passes": passes, "llama_cpp": llama.bin, "rows": table,
        "greedy_text_identical": same_text,
        "held_out": {"prompts": ids.len(), "tokens": 128, "plain_tok_per_s": plain, "engine_auto_tok_per_s": auto,
                     "full_blocks_tok_per_s": full, "tau": tau, "llama_lookup_tok_per_s": lookup_speed,
                     "llama_lookup_drafted": drafted, "llama_lookup_accepted": accepted},
    }))
}
