//! `cargo xtask bench --steps`: the cost of one plain decode step, split into host graph work
//! and evaluation, on the embedded default model and on the mid-size random checkpoint as bf16,
//! 8-bit and 4-bit (each packed for the row kernels, as `auto` loads it, and dequantized to
//! f32, as `--dtype f32` does), all loaded at once and timed round-robin so that machine noise
//! falls on every case alike. Writes `steps.json`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use gemma4::checkpoint::quantize_checkpoint;
use gemma4::step_profile::{profile_steps, StepProfile};
use gemma4::{ComputeDtype, Model};
use serde_json::{json, Value};

struct Case {
    label: String,
    model: Model,
    describe: String,
    steps: usize,
    runs: Vec<StepProfile>,
}

pub(crate) fn quantized(mid: &Path, bits: u32) -> Result<PathBuf> {
    let dir = mid.with_file_name(format!("mid-random-q{bits}"));
    if !dir.join("config.json").is_file() {
        eprintln!("bench: writing the {bits}-bit copy {}", dir.display());
        quantize_checkpoint(mid, &dir, bits, 64, true)?;
    }
    Ok(dir)
}

/// Profiles every case `passes` times, round-robin; the table gives each case's fastest pass.
pub fn run(root: &Path, passes: usize) -> Result<Value> {
    std::fs::create_dir_all(root)?;
    let default = engine::default_model::ensure(false)?;
    let (_, mid) = crate::bench::mid_checkpoint(root, false)?;
    let (q8, q4) = (quantized(&mid, 8)?, quantized(&mid, 4)?);
    let specs: [(&str, &Path, ComputeDtype, usize); 6] = [
        ("default 6.8M bf16, auto", &default, ComputeDtype::Auto, 300),
        ("mid 230M bf16, auto", &mid, ComputeDtype::Auto, 30),
        ("mid 8-bit, auto (packed)", &q8, ComputeDtype::Auto, 30),
        ("mid 8-bit, f32 (dequantized)", &q8, ComputeDtype::F32, 30),
        ("mid 4-bit, auto (packed)", &q4, ComputeDtype::Auto, 30),
        ("mid 4-bit, f32 (dequantized)", &q4, ComputeDtype::F32, 30),
    ];
    let mut cases = Vec::new();
    for (label, dir, dtype, steps) in specs {
        let (model, resolved) = Model::load_as(dir, dtype, mlx_core::Device::Cpu)?;
        eprintln!("bench: {label}: {}", resolved.describe());
        cases.push(Case { label: label.into(), model, describe: resolved.describe(), steps, runs: Vec::new() });
    }
    for pass in 0..passes.max(1) {
        for c in &mut cases {
            let p = profile_steps(&c.model, c.steps)?;
            eprintln!("bench: pass {pass}: {}: {:.2} ms/step", c.label, p.step_ms());
            c.runs.push(p);
        }
    }
    println!("\n| model | compute | nodes/step | build ms | eval ms | ms/token | tok/s |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for c in &cases {
        let best = c.runs.iter().min_by(|a, b| a.step_ms().total_cmp(&b.step_ms())).expect("one pass at least");
        let (model, compute) = c.label.split_once(", ").unwrap_or((&c.label, ""));
        println!(
            "| {model} | {compute} | {} | {:.3} | {:.3} | {:.3} | {:.0} |",
            best.nodes,
            best.build_ms,
            best.eval_ms,
            best.step_ms(),
            1e3 / best.step_ms()
        );
        rows.push(json!({
            "case": c.label, "loaded_as": c.describe, "nodes": best.nodes,
            "nodes_by_primitive": best.by_primitive, "steps": best.steps,
            "build_ms": best.build_ms, "eval_ms": best.eval_ms, "tok_per_s": 1e3 / best.step_ms(),
            "passes_ms": c.runs.iter().map(StepProfile::step_ms).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({ "passes": passes, "cases": rows }))
}
