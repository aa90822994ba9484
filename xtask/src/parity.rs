//! `cargo xtask parity`: our gemma4 against mlx-lm on tiny random checkpoints in the real
//! formats (docs/formats.md, "Tiny test configs"): prompt logits must be bit-identical, and
//! generation token-identical, past the sliding window, for every config including the
//! quantized ones.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gemma4::checkpoint::{quantize_checkpoint, write_hf_layout, write_random_checkpoint};
use gemma4::config::{tiny_config_a, tiny_config_b};
use gemma4::generate::{ids_array, Decoder, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::{ComputeDtype, Model};
use mlx_core::{Array, Dtype};
use serde_json::json;

struct Job {
    name: &'static str,
    model: PathBuf,
    prompt: Vec<u32>,
    max_tokens: usize,
    prefill_step: usize,
    sampler: Option<(SamplerConfig, u64)>,
    /// Compute in f32 (cast at load; mlx-lm: `model.set_dtype(mx.float32)`), else as stored.
    f32: bool,
}

/// A prompt of `n` ids spread over the tiny vocabulary (ids ≥ 4 are ordinary words).
fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11) % 500).collect()
}

fn checkpoints(root: &Path) -> Result<Vec<(&'static str, PathBuf)>> {
    let a = write_random_checkpoint(&root.join("tiny-a-bf16"), &tiny_config_a(), 1234, Dtype::Bf16, 2, true)?;
    let a_q4 = quantize_checkpoint(&a, &root.join("tiny-a-q4"), 4, 64, true)?;
    let a_hf = write_hf_layout(&a, &root.join("tiny-a-hf"), true)?;
    // MoE in bf16 needs GatherMM in bf16, which mlx-cpu lacks: run it in f32, and quantized.
    let b = write_random_checkpoint(&root.join("tiny-b-f32"), &tiny_config_b(), 4321, Dtype::F32, 1, true)?;
    let b16 = write_random_checkpoint(&root.join("tiny-b-bf16-src"), &tiny_config_b(), 4321, Dtype::Bf16, 1, true)?;
    let b_q4 = quantize_checkpoint(&b16, &root.join("tiny-b-q4"), 4, 64, true)?;
    Ok(vec![("A bf16", a), ("A q4", a_q4), ("A hf-naming", a_hf), ("B f32 (MoE)", b), ("B q4 (MoE)", b_q4)])
}

/// The embedded default (trained on the standard library), on a held-out prompt, long enough
/// to decode past its sliding window: as stored (bf16) and cast to f32.
fn default_jobs(tokens: usize) -> Result<Vec<Job>> {
    let dir = engine::default_model::ensure(false)?;
    let prompt = crate::train_default::test_prompt_ids(&dir, 1)?.1.remove(0);
    let window = gemma4::TextConfig::from_dir(&dir)?.sliding_window;
    let max_tokens = tokens.max(window + 32);
    Ok([("default (trained) bf16", false), ("default (trained) f32 (cast at load)", true)]
        .into_iter()
        .map(|(name, f32)| Job {
            name,
            model: dir.clone(),
            prompt: prompt.clone(),
            max_tokens,
            prefill_step: 2048,
            sampler: None,
            f32,
        })
        .collect())
}

fn jobs(models: &[(&'static str, PathBuf)], tokens: usize) -> Vec<Job> {
    let mut v: Vec<Job> = models
        .iter()
        .map(|(name, path)| Job {
            name,
            model: path.clone(),
            prompt: prompt(21),
            max_tokens: tokens,
            prefill_step: 2048,
            sampler: None,
            f32: false,
        })
        .collect();
    let a = models[0].1.clone();
    v.push(Job {
        name: "A bf16 chunked-5",
        model: a.clone(),
        prompt: prompt(33),
        max_tokens: tokens,
        prefill_step: 5,
        sampler: None,
        f32: false,
    });
    // The CPU fast path: the bf16 checkpoint cast to f32 at load, on the optimized BLAS.
    v.push(Job {
        name: "A f32 (cast at load)",
        model: a.clone(),
        prompt: prompt(21),
        max_tokens: tokens,
        prefill_step: 2048,
        sampler: None,
        f32: true,
    });
    let s = SamplerConfig { temperature: 1.0, top_p: 0.9, top_k: 50, ..Default::default() };
    v.push(Job {
        name: "A bf16 sampled",
        model: a.clone(),
        prompt: prompt(21),
        max_tokens: tokens,
        prefill_step: 2048,
        sampler: Some((s, 7)),
        f32: false,
    });
    let s = SamplerConfig { temperature: 0.7, min_p: 0.05, ..Default::default() };
    v.push(Job {
        name: "A q4 sampled",
        model: models[1].1.clone(),
        prompt: prompt(21),
        max_tokens: tokens,
        prefill_step: 2048,
        sampler: Some((s, 11)),
        f32: false,
    });
    v
}

fn file_stem(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

struct Row {
    name: &'static str,
    logits_bitwise: Option<bool>,
    max_logit_diff: Option<f32>,
    matched: usize,
    total: usize,
    max_lp_diff: f32,
    ours_tps: f64,
    ref_tps: f64,
}

fn max_abs_diff(a: &Array, b: &Array) -> Result<f32> {
    let (x, y) = (a.to_f32_vec()?, b.to_f32_vec()?);
    if x.len() != y.len() {
        bail!("shape mismatch {:?} vs {:?}", a.shape()?, b.shape()?);
    }
    // Equal bits (incl. matching infinities) are no difference; a NaN on one side is infinite.
    let diff = |p: f32, q: f32| match (p.to_bits() == q.to_bits(), (p - q).abs()) {
        (true, _) => 0.0,
        (false, d) if d.is_nan() => f32::INFINITY,
        (false, d) => d,
    };
    Ok(x.iter().zip(&y).map(|(&p, &q)| diff(p, q)).fold(0.0, f32::max))
}

fn check(job: &Job, reference: &Path, first_of_model: bool) -> Result<Row> {
    let file = mlx_core::load_safetensors(reference)?;
    let get = |n: &str| file.tensors.get(n).cloned().with_context(|| format!("{}: no tensor {n}", reference.display()));
    let dtype = if job.f32 { ComputeDtype::F32 } else { ComputeDtype::Stored };
    let (model, _) = Model::load_as(&job.model, dtype, mlx_core::Device::Cpu)
        .with_context(|| format!("loading {}", job.model.display()))?;
    let (mut bitwise, mut max_logit) = (None, None);
    if first_of_model {
        let ours = model.logits(&ids_array(&job.prompt)?, None)?.squeeze(0)?;
        let theirs = get("nocache_logits")?;
        bitwise = Some(ours.dtype() == theirs.dtype() && ours.to_bytes()? == theirs.to_bytes()?);
        max_logit = Some(max_abs_diff(&ours, &theirs)?);
    }
    let (sampler, seed) = job.sampler.clone().unwrap_or((SamplerConfig::greedy(), 0));
    let cfg = GenerateConfig {
        max_tokens: job.max_tokens,
        sampler,
        seed,
        prefill_step: job.prefill_step,
        stop_tokens: vec![],
    };
    let ref_tokens = get("tokens")?.to_vec::<u32>()?;
    let ref_lp = get("step_logprobs")?;
    let mut dec = Decoder::new(&model, &job.prompt, &cfg)?;
    let (mut ours, mut lps) = (Vec::new(), Vec::new());
    let t0 = Instant::now();
    let mut t_first = None;
    while let Some(step) = dec.next_step()? {
        t_first.get_or_insert_with(Instant::now);
        ours.push(step.token);
        lps.push(step.logprobs);
    }
    let decode_s = t_first.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0);
    let _ = t0;
    let matched = ours.iter().zip(&ref_tokens).take_while(|(a, b)| a == b).count();
    let mut max_lp = 0f32;
    for (i, lp) in lps.iter().enumerate().take(matched.min(ref_lp.dim(0)? as usize)) {
        let theirs = ref_lp.slice_axis(0, i as i32, i as i32 + 1)?;
        max_lp = max_lp.max(max_abs_diff(&lp.reshape(&[1, -1])?, &theirs.reshape(&[1, -1])?)?);
    }
    let timing: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(reference.with_extension("json")).unwrap_or_default())
            .unwrap_or(json!({}));
    Ok(Row {
        name: job.name,
        logits_bitwise: bitwise,
        max_logit_diff: max_logit,
        matched,
        total: ref_tokens.len().max(job.max_tokens),
        max_lp_diff: max_lp,
        ours_tps: if decode_s > 0.0 { (ours.len().saturating_sub(1)) as f64 / decode_s } else { 0.0 },
        ref_tps: timing["decode_tok_per_s"].as_f64().unwrap_or(0.0),
    })
}

/// Runs the gate; fails unless every row is exact.
pub fn run(root: &Path, venv: &Path, tokens: usize) -> Result<()> {
    // mlx-lm multiplies every f32 product on the BLAS; so do we here (instead of the few-row
    // kernel that makes verify rows equal decode rows, which gemma4's tests check), so the f32
    // rows compare the same kernels.
    std::env::set_var("MLX_CORE_ROW_LINEAR", "0");
    std::fs::create_dir_all(root)?;
    eprintln!("parity: writing tiny checkpoints under {}", root.display());
    let models = checkpoints(root)?;
    let mut jobs = jobs(&models, tokens);
    jobs.extend(default_jobs(tokens)?);
    let python = crate::venv::ensure(venv)?;
    let refs = root.join("reference");
    std::fs::create_dir_all(&refs)?;
    let mut seen = std::collections::BTreeSet::new();
    let spec: Vec<serde_json::Value> = jobs
        .iter()
        .map(|j| {
            let first = seen.insert((j.model.clone(), j.f32));
            let sampler = j.sampler.as_ref().map(|(s, seed)| {
                json!({"temp": s.temperature, "top_p": s.top_p, "min_p": s.min_p, "top_k": s.top_k, "seed": seed})
            });
            json!({"name": file_stem(j.name), "model": j.model, "prompt": j.prompt, "max_tokens": j.max_tokens,
                   "prefill_step": j.prefill_step, "sampler": sampler, "nocache": first,
                   "dtype": if j.f32 { "float32" } else { "stored" }})
        })
        .collect();
    let spec_path = root.join("jobs.json");
    std::fs::write(&spec_path, serde_json::to_string_pretty(&spec)?)?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/reference.py");
    eprintln!("parity: running mlx-lm on {} jobs", jobs.len());
    let mut reference = Command::new(&python);
    reference.arg(&script).arg(&spec_path).arg(&refs);
    // f32 matmuls go through whichever cblas the process loaded first: give mlx-lm the BLAS we
    // link, so the f32 rows compare the same kernels.
    if let Some(blas) = mlx_core::blas::linked() {
        reference.env("LD_PRELOAD", blas);
    }
    let status = reference.status()?;
    if !status.success() {
        bail!("the reference run failed ({status})");
    }
    let mut rows = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for j in &jobs {
        let first = seen.insert((j.model.clone(), j.f32));
        rows.push(check(j, &refs.join(format!("{}.safetensors", file_stem(j.name))), first)?);
    }
    println!();
    println!("| config | prompt logits | max |logit diff| | tokens matched | max |logprob diff| | decode tok/s ours | mlx-lm |");
    println!("|---|---|---|---|---|---|---|");
    let mut ok = true;
    for r in &rows {
        let bit = match r.logits_bitwise {
            Some(true) => "bit-identical",
            Some(false) => "DIFFERENT",
            None => "-",
        };
        let diff = r.max_logit_diff.map(|d| format!("{d:e}")).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {} | {}/{} | {:e} | {:.0} | {:.0} |",
            r.name, bit, diff, r.matched, r.total, r.max_lp_diff, r.ours_tps, r.ref_tps
        );
        ok &= r.logits_bitwise != Some(false) && r.matched == r.total && r.max_lp_diff == 0.0;
    }
    println!();
    if !ok {
        bail!("parity gate FAILED: see the table above");
    }
    println!("parity gate passed: {} configs bit-identical to mlx-lm 0.32.2", rows.len());
    Ok(())
}
