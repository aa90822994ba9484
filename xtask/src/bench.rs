//! `cargo xtask bench`: decode and prefill speed against mlx-lm, the verify cost curve v(k),
//! and the speculative speedup, in one run on this machine (ratios only mean anything within
//! a run). Writes `target/bench/bench.json`.
//!
//! Rows: a mid-size random checkpoint (≈230M parameters: hidden 1024, 8 layers, 4 KV-shared,
//! PLE, vocabulary 32768; `--quick`: a small one) as stored (bf16), computed in f32 on the
//! optimized BLAS, and quantized to 4 bits (as stored and dequantized to f32); and the
//! embedded default model with its drafter for the end-to-end speedup.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gemma4::checkpoint::{quantize_checkpoint, write_random_checkpoint};
use gemma4::generate::{generate, ids_array, prefill, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::{ComputeDtype, Model, TextConfig};
use mlx_core::{Device, Dtype};
use serde_json::{json, Value};

/// Sizes of one bench run.
pub struct Plan {
    pub reps: usize,
    pub decode_tokens: usize,
    pub prefill_tokens: usize,
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan { reps: 3, decode_tokens: 16, prefill_tokens: 128 }
        } else {
            Plan { reps: 3, decode_tokens: 24, prefill_tokens: 512 }
        }
    }
}

fn mid_config(quick: bool) -> Result<TextConfig> {
    let (s, f) = ("sliding_attention", "full_attention");
    let (hidden, vocab, heads, inter, ple) = if quick { (256, 4096, 4, 1024, 64) } else { (1024, 32768, 8, 4096, 256) };
    let v = json!({
        "model_type": "gemma4_text", "hidden_size": hidden, "num_hidden_layers": 8,
        "layer_types": [s, s, s, f, s, s, s, f], "num_kv_shared_layers": 4,
        "intermediate_size": inter, "use_double_wide_mlp": true,
        "num_attention_heads": heads, "num_key_value_heads": 1, "head_dim": hidden / heads, "global_head_dim": 2 * hidden / heads,
        "num_global_key_value_heads": null, "attention_k_eq_v": false,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
        },
        "sliding_window": 512, "hidden_size_per_layer_input": ple,
        "vocab_size": vocab, "vocab_size_per_layer_input": vocab, "final_logit_softcapping": 30.0,
        "enable_moe_block": false, "tie_word_embeddings": true, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    });
    Ok(TextConfig::from_json_str(&v.to_string())?)
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11) % (vocab as u32 - 4)).collect()
}

/// MLX's 4-bit CPU kernels are the slowest path of all (seconds per token on a mid-size model):
/// their row measures fewer tokens.
fn slow_plan(plan: &Plan) -> Plan {
    Plan { reps: plan.reps, decode_tokens: 6, prefill_tokens: 32 }
}

/// Ours: median decode tok/s (8-token prompt) and prefill tok/s.
pub(crate) fn ours_speed(model: &Model, plan: &Plan) -> Result<(f64, f64)> {
    let vocab = model.config().vocab_size;
    let cfg = GenerateConfig { max_tokens: plan.decode_tokens, prefill_step: 2048, ..Default::default() };
    let pcfg = GenerateConfig { max_tokens: 1, prefill_step: 2048, ..Default::default() };
    generate(model, &ids(8, vocab), &GenerateConfig { max_tokens: 2, ..cfg.clone() }, |_| {})?; // warm-up
    let (mut dec, mut pre) = (Vec::new(), Vec::new());
    for _ in 0..plan.reps {
        dec.push(generate(model, &ids(8, vocab), &cfg, |_| {})?.stats.decode_tok_per_s());
        pre.push(generate(model, &ids(plan.prefill_tokens, vocab), &pcfg, |_| {})?.stats.prefill_tok_per_s());
    }
    Ok((median(dec), median(pre)))
}

/// mlx-lm on the same checkpoint (`f32`: cast with `set_dtype`, on our BLAS through LD_PRELOAD).
pub(crate) fn reference_speed(python: &Path, dir: &Path, f32: bool, plan: &Plan, vocab: usize) -> Result<(f64, f64)> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/bench.py");
    let gpu = Device::default_device()? == Device::Gpu;
    let job = json!({"model": dir, "f32": f32, "gpu": gpu, "reps": plan.reps, "decode_tokens": plan.decode_tokens,
                     "decode_prompt": ids(8, vocab), "prefill_prompt": ids(plan.prefill_tokens, vocab)});
    let mut cmd = Command::new(python);
    cmd.arg(&script).arg(job.to_string());
    if let (true, false, Some(blas)) = (f32, gpu, mlx_core::blas::linked()) {
        cmd.env("LD_PRELOAD", blas);
    }
    let out = cmd.output().context("running py/bench.py")?;
    if !out.status.success() {
        bail!("mlx-lm bench failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("parsing py/bench.py output")?;
    Ok((v["decode_tok_per_s"].as_f64().unwrap_or(0.0), v["prefill_tok_per_s"].as_f64().unwrap_or(0.0)))
}

/// v(k) = T(k new tokens on a 64-token cache) / T(one decode step), stepwise and batched.
fn verify_curve(model: &Model, reps: usize) -> Result<(Vec<f64>, Vec<f64>, f64)> {
    let vocab = model.config().vocab_size;
    let mut cache = model.new_cache();
    prefill(model, &mut cache, &ids(64, vocab), 2048)?;
    let time = |cache: &mut gemma4::Cache, k: usize, stepwise: bool| -> Result<f64> {
        let x = ids_array(&ids(k, vocab))?;
        let mut ts = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            let hidden = if stepwise {
                model.forward_stepwise(&x, cache, None)?.hidden
            } else {
                model.forward(&x, Some(cache))?
            };
            model.logits_from_hidden(&hidden)?.eval()?;
            ts.push(t.elapsed().as_secs_f64());
            cache.trim(k)?;
        }
        ts.remove(0); // warm-up
        Ok(median(ts))
    };
    let one = time(&mut cache, 1, false)?;
    let mut stepwise = Vec::new();
    let mut batched = Vec::new();
    for k in 1..=8 {
        stepwise.push(time(&mut cache, k, true)? / one);
        batched.push(time(&mut cache, k, false)? / one);
    }
    Ok((stepwise, batched, one * 1e3))
}

/// A DSpark drafter's round (γ drafts, greedy) after contexts of 64..8192 rows: its context
/// K/V are built once at `reset`/`commit`, so a round should cost about the same at any length.
fn drafter_round_cost(model: &Model, rows: &[usize], window: Option<usize>, reps: usize) -> Result<Vec<(usize, f64)>> {
    use spec_decode::{DraftRequest, DraftSampling, Drafter};
    let tcfg = model.config();
    let mut drafter = bench_drafter(model, window)?;
    let width = (2 * tcfg.hidden_size) as i32;
    let cache = model.new_cache();
    let anchor = mlx_core::Array::from_slice(&[7u32], &[1])?;
    let mut out = Vec::new();
    for &l in rows {
        let key = mlx_core::random::key(l as u64)?;
        let ctx = mlx_core::random::normal(&[1, l as i32, width], model.dtype(), 0.0, 1.0, &key)?;
        drafter.reset(Some(&ctx), l)?;
        let mut ts = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            let req = DraftRequest {
                anchor: &anchor,
                position: l,
                max_drafts: 7,
                sampling: DraftSampling::Greedy,
                target: model,
                target_cache: &cache,
            };
            drafter.propose(req)?.tokens.eval()?;
            ts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ts.remove(0);
        out.push((l, median(ts)));
    }
    Ok(out)
}

/// The drafters the cost benches time: random-init DSpark, γ 7, reading the middle and last
/// layers of `model`, with context `window`.
fn bench_drafter(model: &Model, window: Option<usize>) -> Result<spec_decode::dspark::DSparkDrafter> {
    use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
    let n = model.config().num_hidden_layers;
    let cfg = DSparkConfig { gamma: 7, ctx_window: window, ..DSparkConfig::with_taps(vec![n / 2, n]) };
    Ok(DSparkDrafter::init(cfg, model.config(), "bench", 5, true)?)
}

/// The context window `dspark train` gives a drafter by default (its `--max-ctx`).
const TRAINED_WINDOW: usize = 256;

/// The mid-size (`quick`: small) random checkpoint in bf16 under `root`, written once: its name
/// and directory.
pub(crate) fn mid_checkpoint(root: &Path, quick: bool) -> Result<(&'static str, PathBuf)> {
    let name = if quick { "small-random" } else { "mid-random" };
    let mid = root.join(format!("{name}-bf16"));
    if !mid.join("config.json").is_file() {
        eprintln!("bench: writing the {name} checkpoint (bf16) under {}", root.display());
        write_random_checkpoint(&mid, &mid_config(quick)?, 99, Dtype::Bf16, 1, true)?;
    }
    Ok((name, mid))
}

/// Prefill of an `n`-token prompt, plain and with a DSpark drafter (tapped prefill, then the
/// drafter's context K/V projected and evaluated), in ms: medians of `reps`. The drafter's
/// context is evaluated by its first proposal, so that proposal's time, less a later one's,
/// is counted as prefill.
fn prefill_cost(model: &Model, n: usize, window: Option<usize>, reps: usize) -> Result<(f64, f64)> {
    use spec_decode::{DraftRequest, DraftSampling, Drafter};
    let tcfg = model.config();
    let mut drafter = bench_drafter(model, window)?;
    let taps = drafter.taps();
    let prompt = ids(n, tcfg.vocab_size);
    let (mut plain, mut tapped) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        let mut cache = model.new_cache();
        prefill(model, &mut cache, &prompt, 2048)?.eval()?;
        plain.push(t.elapsed().as_secs_f64() * 1e3);

        let t = Instant::now();
        let mut pre = spec_decode::prefill(model, &taps, &prompt, 2048)?;
        let ctx = pre.take_ctx();
        drafter.reset(ctx.as_ref(), pre.committed())?;
        drop(ctx);
        let anchor = mlx_core::Array::from_slice(&[pre.pending()], &[1])?;
        let mut propose = || -> Result<()> {
            let req = DraftRequest {
                anchor: &anchor,
                position: pre.committed(),
                max_drafts: 7,
                sampling: DraftSampling::Greedy,
                target: model,
                target_cache: pre.cache(),
            };
            Ok(drafter.propose(req)?.tokens.eval()?)
        };
        propose()?;
        let with_first_round = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        propose()?;
        tapped.push(with_first_round - t.elapsed().as_secs_f64() * 1e3);
    }
    Ok((median(plain), median(tapped)))
}

/// `cargo xtask bench --costs`: the CPU fast path's cost targets on the mid-size checkpoint in
/// f32: v(k) stepwise and batched, the drafter's round by context length, and prefill of a
/// 4,096-token prompt with and without a drafter.
pub fn costs(root: &Path, reps: usize) -> Result<Value> {
    std::fs::create_dir_all(root)?;
    let (name, mid) = mid_checkpoint(root, false)?;
    let (model, resolved) = Model::load_as(&mid, ComputeDtype::F32, Device::default_device()?)?;
    println!("bench --costs: {name}, {} on {:?}", resolved.describe(), Device::default_device()?);
    let (stepwise, batched, step_ms) = verify_curve(&model, reps)?;
    println!("one decode step (64-token cache): {step_ms:.1} ms");
    let fmt = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" ");
    println!("v(k), k = 1..8, stepwise: {}", fmt(&stepwise));
    println!("v(k), k = 1..8, batched:  {}", fmt(&batched));
    let png = root.join("verify_cost_f32.png");
    let curves = [("f32 stepwise", &stepwise), ("f32 batched", &batched)]
        .map(|(label, v)| dspark::plot::Curve { label: label.to_string(), values: v.clone() });
    if dspark::plot::verify_cost(&png, &format!("verify cost, {name} checkpoint, f32 (64-token cache)"), &curves)? {
        println!("wrote {}", png.display());
    }
    let mut rounds = Vec::new();
    for window in [None, Some(TRAINED_WINDOW)] {
        let r = drafter_round_cost(&model, &[64, 512, 2048, 8192], window, reps)?;
        let base = r.first().map_or(1.0, |r| r.1).max(1e-9);
        let label = window.map_or("whole context".to_string(), |w| format!("window {w}"));
        for (l, ms) in &r {
            println!("drafter round ({label}) after {l:>5} context rows: {ms:.2} ms ({:.2}×)", ms / base);
        }
        rounds.push(json!({"window": window, "ms_by_context_rows": r}));
    }
    let (plain, tapped) = prefill_cost(&model, 4096, Some(TRAINED_WINDOW), reps.min(3))?;
    println!(
        "prefill of 4,096 tokens: plain {:.0} ms, with a drafter (window {TRAINED_WINDOW}) {:.0} ms ({:.2}×)",
        plain,
        tapped,
        tapped / plain.max(1e-9)
    );
    Ok(json!({
        "checkpoint": mid, "compute": resolved.describe(), "verify_cost": {"stepwise": stepwise, "batched": batched, "decode_step_ms": step_ms},
        "drafter_round_ms": rounds,
        "prefill_4096_ms": {"plain": plain, "with_drafter": tapped, "window": TRAINED_WINDOW},
    }))
}

pub fn run(root: &Path, venv: &Path, quick: bool) -> Result<()> {
    let plan = Plan::new(quick);
    std::fs::create_dir_all(root)?;
    let check = mlx_core::blas::sgemm_check(1024, 5)?;
    println!(
        "bench: MLX {} on {:?} | BLAS {}{} | f32 1024² matmul {:.1} GFLOP/s | row quantum {} | {} CPU threads",
        mlx_core::mlx_version(),
        Device::default_device()?,
        mlx_core::blas::linked().unwrap_or("bundled reference"),
        mlx_core::blas::openblas_core().map(|c| format!(" ({c} kernels)")).unwrap_or_default(),
        check.gflops,
        mlx_core::blas::row_quantum(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if let Some(why) = mlx_core::blas::openblas_fallback() {
        println!("warning: {why}");
    }
    let cfg = mid_config(quick)?;
    let (name, mid) = mid_checkpoint(root, quick)?;
    let q4 = root.join(format!("{name}-q4"));
    if !q4.join("config.json").is_file() {
        quantize_checkpoint(&mid, &q4, 4, 64, true)?;
    }
    let python = crate::venv::ensure(venv)?;
    let vocab = cfg.vocab_size;
    let mut rows = Vec::new();
    println!("\n| checkpoint | compute | decode tok/s ours | mlx-lm | ratio | prefill tok/s ours | mlx-lm | ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    // `auto` on the CPU reads bf16 matrices as stored and keeps 4-bit ones packed (the same
    // bits as `f32` for bf16; fewer bytes a step); `f32` converts and dequantizes everything.
    let cases: [(&Path, ComputeDtype, &str, Option<bool>); 6] = [
        (&mid, ComputeDtype::Stored, "bf16", Some(false)),
        (&mid, ComputeDtype::F32, "f32", Some(true)),
        (&mid, ComputeDtype::Auto, "auto (bf16 read as f32)", None),
        (&q4, ComputeDtype::Stored, "4-bit", Some(false)),
        (&q4, ComputeDtype::F32, "4-bit → f32", None),
        (&q4, ComputeDtype::Auto, "4-bit packed (auto)", None),
    ];
    let mut curves = Vec::new();
    let mut drafter_rounds = Vec::new();
    for (dir, dtype, label, reference) in cases {
        let (model, _) = Model::load_as(dir, dtype, Device::default_device()?)?;
        let slow = slow_plan(&plan);
        let p = if dir == q4.as_path() && dtype == ComputeDtype::Stored { &slow } else { &plan };
        let (dec, pre) = ours_speed(&model, p)?;
        let (rdec, rpre) = match reference {
            Some(f32) => reference_speed(&python, dir, f32, p, vocab)?,
            None => (0.0, 0.0),
        };
        let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}×", a / b) } else { "-".into() };
        println!(
            "| {} | {label} | {dec:.2} | {rdec:.2} | {} | {pre:.0} | {rpre:.0} | {} |",
            dir.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            ratio(dec, rdec),
            ratio(pre, rpre)
        );
        rows.push(
            json!({"checkpoint": dir, "compute": label, "decode_tok_per_s": dec, "mlx_lm_decode_tok_per_s": rdec,
                         "prefill_tok_per_s": pre, "mlx_lm_prefill_tok_per_s": rpre}),
        );
        if matches!(dtype, ComputeDtype::F32 | ComputeDtype::Stored) && dir == mid.as_path() {
            let (step, batch, _) = verify_curve(&model, plan.reps)?;
            curves.push(json!({"compute": label, "stepwise": step, "batched": batch}));
            if dtype == ComputeDtype::F32 {
                let sizes: &[usize] = if quick { &[64, 512, 2048] } else { &[64, 512, 2048, 8192] };
                drafter_rounds = drafter_round_cost(&model, sizes, Some(TRAINED_WINDOW), plan.reps)?;
            }
        }
    }
    println!("\nv(k) = cost of scoring k tokens / one decode step (64-token cache):");
    println!("| compute | forward | k=1 | 2 | 3 | 4 | 5 | 6 | 7 | 8 |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for c in &curves {
        for kind in ["stepwise", "batched"] {
            let v: Vec<String> =
                c[kind].as_array().into_iter().flatten().map(|x| format!("{:.2}", x.as_f64().unwrap_or(0.0))).collect();
            println!("| {} | {kind} | {} |", c["compute"].as_str().unwrap_or("?"), v.join(" | "));
        }
    }
    let base = drafter_rounds.first().map_or(1.0, |r| r.1);
    println!("\nDSpark drafter round (γ 7, greedy, f32, context window {TRAINED_WINDOW}) by context rows:");
    for (l, ms) in &drafter_rounds {
        println!("  {l:>5} rows: {ms:.2} ms ({:.2}× the 64-row cost)", ms / base.max(1e-9));
    }
    let png = root.join("verify_cost.png");
    let plot_curves: Vec<dspark::plot::Curve> = curves
        .iter()
        .flat_map(|c| {
            ["stepwise", "batched"].map(|kind| dspark::plot::Curve {
                label: format!("{} {kind}", c["compute"].as_str().unwrap_or("?")),
                values: c[kind].as_array().into_iter().flatten().filter_map(Value::as_f64).collect(),
            })
        })
        .collect();
    if dspark::plot::verify_cost(&png, &format!("verify cost, {name} checkpoint (64-token cache)"), &plot_curves)? {
        println!("wrote {}", png.display());
    }
    let (prompts, tokens) = if quick { (4, 32) } else { (20, 128) };
    let spec = default_pair(prompts, tokens, 1)?;
    let rss = dspark::train::peak_rss_mib();
    println!("\npeak RSS {:.0} MiB", rss.unwrap_or(0.0));
    let report = json!({
        "quick": quick, "blas": mlx_core::blas::linked(), "sgemm_gflops": check.gflops,
        "row_quantum": mlx_core::blas::row_quantum(), "speed": rows, "verify_cost": curves,
        "drafter_round_ms": drafter_rounds.iter().map(|(l, ms)| json!({"context_rows": l, "ms": ms})).collect::<Vec<_>>(),
        "speculative": spec, "peak_rss_mib": rss,
    });
    let path = root.join("bench.json");
    mlx_core::files::write_atomic(&path, serde_json::to_string_pretty(&report)?.as_bytes())?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Where a speculative round's time goes on a model + drafter pair, after a `ctx`-token
/// prompt: one plain decode step, the drafter's proposal alone, the stepwise (and batched)
/// verify of γ+1 rows alone, and the drafter's commit of γ+1 rows, each evaluated on its own
/// (fastest of `reps`), plus the whole round as `SpecRounds` runs it. Milliseconds.
pub fn round_breakdown(model_dir: &Path, drafter_dir: &Path, ctx: usize, reps: usize) -> Result<Value> {
    use spec_decode::{DraftRequest, DraftSampling};
    let (model, resolved) = Model::load_as(model_dir, ComputeDtype::Auto, Device::default_device()?)?;
    let mut drafter = spec_decode::load_drafter(drafter_dir, model.config())?;
    let gamma = drafter.gamma();
    let taps = drafter.taps();
    let vocab = model.config().vocab_size;
    let prompt = ids(ctx, vocab);
    let pre = spec_decode::prefill(&model, &taps, &prompt, 2048)?;
    let committed = pre.committed();
    let mut pre = pre;
    let ctx_rows = pre.take_ctx();
    drafter.reset(ctx_rows.as_ref(), committed)?;
    let mut cache = pre.cache().clone();
    let timed = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut ts = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            f()?;
            ts.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ts.remove(0);
        // The fastest run: this is overhead-bound work, and noise only ever adds time.
        Ok(ts.iter().copied().fold(f64::INFINITY, f64::min))
    };
    let anchor = mlx_core::Array::from_slice(&[pre.pending()], &[1])?;
    let step = timed(&mut || {
        let h = model.forward(&anchor.reshape(&[1, 1])?, Some(&mut cache))?;
        model.logits_from_hidden(&h)?.argmax(-1, false)?.eval()?;
        cache.trim(1)?;
        Ok(())
    })?;
    let propose = timed(&mut || {
        let req = DraftRequest {
            anchor: &anchor,
            position: cache.offset(),
            max_drafts: gamma,
            sampling: DraftSampling::Greedy,
            target: &model,
            target_cache: &cache,
        };
        drafter.propose(req)?.tokens.eval()?;
        Ok(())
    })?;
    let t1 = SamplerConfig { temperature: 1.0, ..Default::default() };
    let mut keys = mlx_core::random::KeyChain::new(0)?;
    let propose_sampled = timed(&mut || {
        let req = DraftRequest {
            anchor: &anchor,
            position: cache.offset(),
            max_drafts: gamma,
            sampling: DraftSampling::Sample { cfg: &t1, keys: &mut keys },
            target: &model,
            target_cache: &cache,
        };
        let p = drafter.propose(req)?;
        match &p.q {
            Some(q) => mlx_core::eval(&[&p.tokens, q])?,
            None => p.tokens.eval()?,
        }
        Ok(())
    })?;
    let window = ids_array(&ids(gamma + 1, vocab))?;
    let verify = |stepwise: bool, cache: &mut gemma4::Cache| -> Result<f64> {
        timed(&mut || {
            let hidden = if stepwise {
                model.forward_stepwise(&window, cache, Some(&taps))?.hidden
            } else {
                model.forward(&window, Some(cache))?
            };
            model.logits_from_hidden(&hidden)?.argmax(-1, false)?.eval()?;
            cache.trim(gamma + 1)?;
            Ok(())
        })
    };
    if let Ok(mode) = std::env::var("DSPARK_PROFILE_LOOP") {
        // Profiling aid: repeat one part many times (perf record), then stop.
        for _ in 0..300 {
            match mode.as_str() {
                "stepwise" => {
                    let h = model.forward_stepwise(&window, &mut cache, Some(&taps))?.hidden;
                    model.logits_from_hidden(&h)?.argmax(-1, false)?.eval()?;
                    cache.trim(gamma + 1)?;
                }
                "step" => {
                    let h = model.forward(&anchor.reshape(&[1, 1])?, Some(&mut cache))?;
                    model.logits_from_hidden(&h)?.argmax(-1, false)?.eval()?;
                    cache.trim(1)?;
                }
                _ => {
                    let h = model.forward(&window, Some(&mut cache))?;
                    model.logits_from_hidden(&h)?.argmax(-1, false)?.eval()?;
                    cache.trim(gamma + 1)?;
                }
            }
        }
        return Ok(json!({}));
    }
    let verify_stepwise = verify(true, &mut cache)?;
    let verify_batched = verify(false, &mut cache)?;
    let width = (taps.points().len() * model.config().hidden_size) as i32;
    let rows =
        mlx_core::random::normal(&[1, (gamma + 1) as i32, width], Dtype::F32, 0.0, 1.0, &mlx_core::random::key(1)?)?;
    let commit = timed(&mut || {
        // Commit, then reset to the prompt context so the context does not grow between reps.
        drafter.commit(Some(&rows), gamma + 1)?;
        mlx_core::eval(&[&rows])?;
        Ok(())
    })?;
    drafter.reset(ctx_rows.as_ref(), committed)?;
    let cfg = GenerateConfig {
        max_tokens: 64,
        sampler: SamplerConfig::greedy(),
        seed: 0,
        prefill_step: 2048,
        stop_tokens: vec![],
    };
    let plain = timed(&mut || {
        generate(&model, &prompt, &cfg, |_| {})?;
        Ok(())
    })?;
    let mut spec_stats = None;
    let spec = timed(&mut || {
        let mut d = spec_decode::load_drafter(drafter_dir, model.config())?;
        let sc = spec_decode::SpecConfig { generate: cfg.clone(), gamma: None, pruning: spec_decode::Pruning::Off };
        let s = spec_decode::speculative_generate(&model, d.as_mut(), &prompt, &sc, |_| {})?;
        spec_stats = Some((s.stats.rounds, s.stats.tau(), s.stats.decode_ms));
        Ok(())
    })?;
    let (rounds, tau, _) = spec_stats.unwrap_or((0, 0.0, 0.0));
    // The same at T = 1: a sampled round adds filtering, draws and the residual.
    let sampled_cfg = GenerateConfig { sampler: t1.clone(), ..cfg.clone() };
    let mut sampled_stats = None;
    let plain_sampled = timed(&mut || {
        generate(&model, &prompt, &sampled_cfg, |_| {})?;
        Ok(())
    })?;
    let spec_sampled = timed(&mut || {
        let mut d = spec_decode::load_drafter(drafter_dir, model.config())?;
        let sc =
            spec_decode::SpecConfig { generate: sampled_cfg.clone(), gamma: None, pruning: spec_decode::Pruning::Off };
        let s = spec_decode::speculative_generate(&model, d.as_mut(), &prompt, &sc, |_| {})?;
        sampled_stats = Some((s.stats.rounds, s.stats.tau(), s.stats.decode_ms));
        Ok(())
    })?;
    let (rounds_sampled, tau_sampled, decode_sampled) = sampled_stats.unwrap_or((0, 0.0, 0.0));
    Ok(json!({
        "compute": resolved.describe(), "gamma": gamma, "context": ctx,
        "decode_step_ms": step, "propose_ms": propose, "verify_stepwise_ms": verify_stepwise,
        "verify_batched_ms": verify_batched, "commit_ms": commit,
        "plain_64_ms": plain, "speculative_64_ms": spec, "rounds": rounds, "tau": tau,
        "propose_sampled_ms": propose_sampled, "plain_64_sampled_ms": plain_sampled,
        "speculative_64_sampled_ms": spec_sampled, "rounds_sampled": rounds_sampled, "tau_sampled": tau_sampled,
        "sampled_round_in_steps": decode_sampled / rounds_sampled.max(1) as f64 / step,
    }))
}

/// The embedded default pair on `n` held-out prompts (heads of test-split files of the
/// standard library), `max_tokens` each, greedy and sampled: plain and speculative end-to-end
/// times per prompt (prefill included, medians of `reps`), τ, and for greedy whether the
/// outputs are identical. The speedup's min / median / max over prompts is what the README
/// reports, beside the share of outputs that loop ([`crate::repeats::loops`]) and the median
/// speedup over the outputs that do not.
pub fn default_pair(n: usize, max_tokens: usize, reps: usize) -> Result<Value> {
    let dir = engine::default_model::ensure(false)?;
    let ddir = engine::default_model::ensure_drafter(false)?;
    let (model, resolved) = Model::load_as(&dir, ComputeDtype::Auto, Device::default_device()?)?;
    let (prompts, ids) = crate::train_default::test_prompt_ids(&dir, n)?;
    let samplers = [
        ("greedy", SamplerConfig::greedy()),
        ("T=1", SamplerConfig { temperature: 1.0, ..Default::default() }),
        ("T=0.7 top-p 0.95", SamplerConfig { temperature: 0.7, top_p: 0.95, ..Default::default() }),
    ];
    let mut drafter = spec_decode::load_drafter(&ddir, model.config())?;
    let gamma = drafter.gamma();
    // Warm-up: first-call allocations and kernel set-up are paid here, outside the timings.
    let warm = GenerateConfig {
        max_tokens: 8,
        sampler: SamplerConfig::greedy(),
        seed: 0,
        prefill_step: 2048,
        stop_tokens: vec![],
    };
    generate(&model, &ids[0], &warm, |_| {})?;
    let sc = spec_decode::SpecConfig { generate: warm, gamma: None, pruning: spec_decode::Pruning::Off };
    spec_decode::speculative_generate(&model, drafter.as_mut(), &ids[0], &sc, |_| {})?;
    let mut rows = Vec::new();
    println!("\nthe default pair on {n} held-out prompts × {max_tokens} tokens (γ {gamma}, {}):", resolved.describe());
    println!(
        "| sampling | speedup min | median | max | outputs that loop | median without loops | τ | acceptance | plain tok/s | speculative tok/s | greedy outputs identical | engine auto: median | without loops | tok/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, sampler) in samplers {
        let mut speedups = Vec::new();
        let mut looping = Vec::new();
        let mut totals = spec_decode::SpecStats::default();
        let (mut plain_total, mut spec_total, mut auto_total, mut identical) = (0.0, 0.0, 0.0, 0usize);
        let mut auto_speedups = Vec::new();
        for (i, prompt) in ids.iter().enumerate() {
            let cfg = held_out_config(max_tokens, &sampler, i);
            let (mut plain, mut spec, mut auto) = (Vec::new(), Vec::new(), Vec::new());
            let (mut plain_tokens, mut spec_tokens) = (Vec::new(), Vec::new());
            let mut stats = spec_decode::SpecStats::default();
            for _ in 0..reps {
                let g = generate(&model, prompt, &cfg, |_| {})?;
                plain.push(g.stats.prefill_ms + g.stats.decode_ms);
                plain_tokens = g.tokens;
                let sc =
                    spec_decode::SpecConfig { generate: cfg.clone(), gamma: None, pruning: spec_decode::Pruning::Off };
                let s = spec_decode::speculative_generate(&model, drafter.as_mut(), prompt, &sc, |_| {})?;
                spec.push(s.stats.prefill_ms + s.stats.decode_ms);
                spec_tokens = s.tokens;
                stats = s.stats;
                let req = auto_request(prompt, &cfg);
                let t = Instant::now();
                let session = engine::Session::start(&model, Some(drafter.as_mut()), &req, None, None)?;
                let out = session.run(Some(drafter.as_mut()), |_| {})?;
                auto.push(t.elapsed().as_secs_f64() * 1e3);
                if sampler.is_greedy() && out.tokens != plain_tokens {
                    bail!("greedy output of the engine session differs from plain decoding on held-out prompt {i}");
                }
            }
            let (p, s, a) = (median(plain), median(spec), median(auto));
            plain_total += p;
            spec_total += s;
            auto_total += a;
            speedups.push(p / s.max(1e-9));
            auto_speedups.push(p / a.max(1e-9));
            looping.push(crate::repeats::loops(&plain_tokens));
            totals.absorb(&stats);
            if plain_tokens == spec_tokens {
                identical += 1;
            } else if sampler.is_greedy() {
                bail!(
                    "greedy speculative output differs from plain decoding on held-out prompt {i} ({})",
                    prompts[i].source
                );
            }
        }
        let mut sorted = speedups.clone();
        sorted.sort_by(f64::total_cmp);
        let (min, med, max) = (sorted[0], sorted[sorted.len() / 2], sorted[sorted.len() - 1]);
        let rate = |ms: f64| (n * max_tokens) as f64 / (ms / 1e3).max(1e-9);
        let same = if sampler.is_greedy() { format!("{identical}/{n}") } else { "-".into() };
        let loop_free: Vec<f64> = speedups.iter().zip(&looping).filter(|(_, &l)| !l).map(|(s, _)| *s).collect();
        let loop_free_median = (!loop_free.is_empty()).then(|| median(loop_free.clone()));
        let loops = looping.iter().filter(|&&l| l).count();
        let auto_median = median(auto_speedups.clone());
        let auto_loop_free: Vec<f64> =
            auto_speedups.iter().zip(&looping).filter(|(_, &l)| !l).map(|(s, _)| *s).collect();
        let auto_loop_free_median = (!auto_loop_free.is_empty()).then(|| median(auto_loop_free));
        let times = |m: Option<f64>| m.map_or_else(|| "-".to_string(), |m| format!("{m:.2}×"));
        println!(
            "| {name} | {min:.2}× | {med:.2}× | {max:.2}× | {loops}/{n} | {} ({} outputs) | {:.2} | {:.1}% | {:.1} | {:.1} | {same} | {auto_median:.2}× | {} | {:.1} |",
            times(loop_free_median),
            loop_free.len(),
            totals.tau(),
            100.0 * totals.acceptance_rate(),
            rate(plain_total),
            rate(spec_total),
            times(auto_loop_free_median),
            rate(auto_total)
        );
        rows.push(json!({"sampling": name, "speedup_min": min, "speedup_median": med, "speedup_max": max,
                         "speedups": speedups, "looping": looping, "loop_free_speedup_median": loop_free_median,
                         "long_repeat_tokens": crate::repeats::LONG_REPEAT, "tau": totals.tau(), "acceptance": totals.acceptance_rate(),
                         "plain_tok_per_s": rate(plain_total), "speculative_tok_per_s": rate(spec_total),
                         "engine_auto_speedups": auto_speedups, "engine_auto_speedup_median": auto_median,
                         "engine_auto_loop_free_speedup_median": auto_loop_free_median, "engine_auto_tok_per_s": rate(auto_total),
                         "identical": identical, "accepted_by_position": totals.accepted_by_pos,
                         "drafted_by_position": totals.drafted_by_pos}));
    }
    Ok(json!({"prompts": n, "max_tokens": max_tokens, "gamma": gamma, "compute": resolved.describe(), "rows": rows}))
}

/// What `dspark generate` and a server with one request run: an engine session under the
/// `auto` schedule without a profile (full blocks while drafting pays, plain steps where it has
/// not), unseeded so sampled requests adapt too.
pub(crate) fn auto_request(prompt: &[u32], cfg: &GenerateConfig) -> engine::Request {
    engine::Request {
        prompt: prompt.to_vec(),
        generate: cfg.clone(),
        stop: vec![],
        gamma: None,
        pruning: spec_decode::Pruning::Off,
        kept_tokens: vec![],
        seeded: false,
        adaptive: true,
    }
}

/// How the default-pair benchmarks decode held-out prompt `i`: no stop token (every prompt
/// runs its full length) and the prompt's index as the seed.
pub(crate) fn held_out_config(max_tokens: usize, sampler: &SamplerConfig, i: usize) -> GenerateConfig {
    GenerateConfig { max_tokens, sampler: sampler.clone(), seed: i as u64, prefill_step: 2048, stop_tokens: vec![] }
}

/// Draft-length schedules on the embedded default pair: decode speed over `n` held-out prompts
/// × `max_tokens` with the throughput schedule (calibrated survivals against this machine's
/// verify-cost profile, measured first when the model has none) against full blocks and every
/// static γ, greedy and T = 1, interleaved per prompt in one run, `passes` times over. Ratios are
/// to plain decoding of the same prompts.
pub fn schedules(n: usize, max_tokens: usize, passes: usize) -> Result<Value> {
    let passes = passes.max(1);
    use spec_decode::{Pruning, SpecConfig, ThroughputPlan};
    let dir = engine::default_model::ensure(false)?;
    let ddir = engine::default_model::ensure_drafter(false)?;
    let (model, resolved) = Model::load_as(&dir, ComputeDtype::Auto, Device::default_device()?)?;
    let (_, ids) = crate::train_default::test_prompt_ids(&dir, n)?;
    let mut drafter = spec_decode::load_drafter(&ddir, model.config())?;
    let gamma = drafter.gamma();
    let key = spec_decode::profile::profile_key(Device::default_device()?, &model);
    // A profile that prices rounds differently from this drafter (other taps, or whole blocks
    // only) is measured again.
    let profile = match spec_decode::profile::load(&dir, &key)? {
        Some(p) if p.mismatch(drafter.as_ref(), &model).is_none() => p,
        _ => {
            let p = spec_decode::profile::measure(&model, Some(drafter.as_mut()), gamma + 1, 64, 7)?;
            spec_decode::profile::store(&dir, &key, &p)?;
            p
        }
    };
    let cost: Vec<String> = profile.cost.iter().map(|v| format!("{v:.2}")).collect();
    let steps = |d: &Option<Vec<f32>>| d.iter().flatten().map(|v| format!("{v:.2}")).collect::<Vec<_>>().join(", ");
    println!(
        "\nverify-cost profile {key}: v(1..={}) = [{}]; proposing 1..={gamma} drafts: [{}] steps greedy, [{}] sampled",
        profile.cost.len(),
        cost.join(", "),
        steps(&profile.draft_by_len),
        steps(&profile.draft_by_len_sampled)
    );
    let mut rows = Vec::new();
    for (mode, sampler) in
        [("greedy", SamplerConfig::greedy()), ("T=1", SamplerConfig { temperature: 1.0, ..Default::default() })]
    {
        let temps = drafter
            .sts(sampler.is_greedy())
            .with_context(|| format!("the default drafter has no {mode} calibration (dspark calibrate)"))?;
        let mut settings: Vec<(String, Option<usize>, Pruning)> =
            (1..=gamma).map(|g| (format!("static γ {g}"), Some(g), Pruning::Off)).collect();
        let greedy = sampler.is_greedy();
        let plan = ThroughputPlan::new(temps.clone(), profile.round_cost(greedy, true));
        // The schedule proposing the whole block every round (and pricing rounds so), to show
        // what the draft cap saves.
        let whole = ThroughputPlan::new(temps, profile.round_cost(greedy, false)).without_draft_cap();
        // Each round maximising its own Θ (the paper's Algorithm 1 as stated) instead of pricing
        // drafts at the request's rate.
        settings.push(("throughput, per-round Θ".into(), None, Pruning::Throughput(plan.clone().per_round_ratio())));
        settings.push(("throughput, whole block".into(), None, Pruning::Throughput(whole)));
        settings.push(("throughput".into(), None, Pruning::Throughput(plan)));
        // Full blocks with the schedule's one host read of the confidences before the verify
        // (nothing pruned): what that read costs on its own.
        settings.push((format!("static γ {gamma}, confidences read"), Some(gamma), Pruning::Thresholds(vec![])));
        let mut plain_ms = 0.0;
        // Per pass, per setting: the same prompts and seeds each pass, so passes differ only by
        // timing noise, and their spread shows how far one pass can be trusted.
        let mut pass_ms = vec![vec![0.0f64; settings.len()]; passes];
        let mut stats = vec![spec_decode::SpecStats::default(); settings.len()];
        for pass in pass_ms.iter_mut() {
            for (i, prompt) in ids.iter().enumerate() {
                let cfg = held_out_config(max_tokens, &sampler, i);
                let g = generate(&model, prompt, &cfg, |_| {})?;
                plain_ms += g.stats.prefill_ms + g.stats.decode_ms;
                for (k, (_, gamma, pruning)) in settings.iter().enumerate() {
                    let sc = SpecConfig { generate: cfg.clone(), gamma: *gamma, pruning: pruning.clone() };
                    let s = spec_decode::speculative_generate(&model, drafter.as_mut(), prompt, &sc, |_| {})?;
                    if sampler.is_greedy() && s.tokens != g.tokens {
                        bail!("{}: greedy output differs from plain decoding on held-out prompt {i}", settings[k].0);
                    }
                    pass[k] += s.stats.prefill_ms + s.stats.decode_ms;
                    stats[k].absorb(&s.stats);
                }
            }
        }
        let ms: Vec<f64> = (0..settings.len()).map(|k| pass_ms.iter().map(|p| p[k]).sum()).collect();
        let rate = |t: f64| (passes * n * max_tokens) as f64 / (t / 1e3).max(1e-9);
        let best_static = (0..gamma).max_by(|&a, &b| rate(ms[a]).total_cmp(&rate(ms[b]))).unwrap_or(0);
        println!(
            "\n{mode}, {n} held-out prompts × {max_tokens} tokens ({}): plain {:.1} tok/s",
            resolved.describe(),
            rate(plain_ms)
        );
        println!("| schedule | tok/s | vs plain | τ | drafts verified per round | plain steps |");
        println!("|---|---|---|---|---|---|");
        for (k, (name, _, _)) in settings.iter().enumerate() {
            let st = &stats[k];
            let mark = if k == best_static { " (best static)" } else { "" };
            println!(
                "| {name}{mark} | {:.1} | {:.2}× | {:.2} | {:.2} | {} |",
                rate(ms[k]),
                plain_ms / ms[k].max(1e-9),
                st.tau(),
                st.drafted as f64 / st.rounds.max(1) as f64,
                st.plain_steps
            );
        }
        let (thr, read) = (settings.len() - 2, settings.len() - 1);
        println!(
            "throughput schedule vs best static ({}): {:.2}×; vs full blocks (γ {gamma}): {:.2}×; vs per-round Θ: {:.2}×; \
             vs proposing whole blocks: {:.2}×; full blocks with the confidence read vs without: {:.2}×",
            settings[best_static].0,
            ms[best_static] / ms[thr].max(1e-9),
            ms[gamma - 1] / ms[thr].max(1e-9),
            ms[thr - 2] / ms[thr].max(1e-9),
            ms[thr - 1] / ms[thr].max(1e-9),
            ms[gamma - 1] / ms[read].max(1e-9)
        );
        let per_pass: Vec<f64> = pass_ms.iter().map(|p| p[best_static] / p[thr].max(1e-9)).collect();
        if passes > 1 {
            println!(
                "throughput schedule vs {} by pass: {}",
                settings[best_static].0,
                per_pass.iter().map(|r| format!("{r:.2}×")).collect::<Vec<_>>().join(", ")
            );
        }
        rows.push(json!({"mode": mode, "plain_tok_per_s": rate(plain_ms),
            "settings": settings.iter().enumerate().map(|(k, s)| json!({"schedule": s.0, "tok_per_s": rate(ms[k]),
                "tau": stats[k].tau(), "rounds": stats[k].rounds, "drafted": stats[k].drafted,
                "plain_steps": stats[k].plain_steps})).collect::<Vec<_>>(),
            "best_static": settings[best_static].0, "throughput_vs_best_static": ms[best_static] / ms[thr].max(1e-9),
            "throughput_vs_per_round": ms[thr - 2] / ms[thr].max(1e-9), "throughput_vs_best_static_by_pass": per_pass}));
    }
    Ok(json!({"prompts": n, "max_tokens": max_tokens, "passes": passes, "profile": profile.cost, "rows": rows}))
}
