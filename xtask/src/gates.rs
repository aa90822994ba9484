//! `cargo xtask gates`: the losslessness gates of speculative decoding.
//!
//! - greedy-parity: speculative greedy output == plain greedy output, token for token, for every
//!   tiny target (bf16, 4-bit, MoE), drafter (random-init DSpark, the target's own continuation)
//!   and γ ∈ {1, 3, 7}, with confidence pruning on and off, decoding far past the sliding window.
//!   It fails if no draft was accepted (a vacuous gate).
//! - distribution-equality: with a tiny-vocabulary target, the joint law of the first two emitted
//!   tokens under speculative sampling equals plain sampling (χ² goodness of fit against the exact
//!   law and χ² homogeneity against plain samples, α = 0.001), at T ∈ {0.7, 1.0} with filters on
//!   and off; and the same test rejects a deliberately broken verifier (accept every draft).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gemma4::checkpoint::{quantize_checkpoint, write_random_checkpoint};
use gemma4::config::{tiny_config_a, tiny_config_b};
use gemma4::generate::{generate, prefill as plain_prefill, step_logits};
use gemma4::sampling::{logprobs, Sampler, SamplerConfig};
use gemma4::{Model, TextConfig};
use mlx_core::{Array, Dtype};
use spec_decode::decode::{decode_from, prefill, VerifyRule};
use spec_decode::deepspec::{write_synthetic_deepspec, DeepSpecDrafter, SyntheticDeepSpec};
use spec_decode::dspark::{fit_bigram_drafter, DSparkConfig, DSparkDrafter};
use spec_decode::oracle::SelfDrafter;
use spec_decode::probs::probabilities;
use spec_decode::{speculative_generate, Drafter, Pruning, SpecConfig};

use crate::chisq;

const ALPHA: f64 = 0.001;

fn prompt(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11) % (vocab - 4)).collect()
}

/// A random-init DSpark drafter for `target` with random Markov/confidence heads, so drafts,
/// Markov bias and pruning are all exercised.
pub fn random_dspark(target: &TextConfig, gamma: usize, seed: u64) -> Result<DSparkDrafter> {
    let n = target.num_hidden_layers;
    let cfg = DSparkConfig {
        gamma,
        d_draft: 64,
        n_layers: 2,
        n_heads: 4,
        markov_rank: 32,
        ff_mult: 2,
        tap_layers: vec![1, n / 2, n],
        seq_head: None,
        sts: None,
    };
    Ok(DSparkDrafter::init(cfg, target, "tiny", seed, true)?)
}

/// A DSpark drafter fitted by counting the target's greedy bigrams on 8 prompts (not the gate's).
fn fitted_dspark(model: &Model) -> Result<DSparkDrafter> {
    let v = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| prompt(6, v).iter().map(|x| 4 + (x + i * 53) % (v - 4)).collect()).collect();
    Ok(fit_bigram_drafter(model, "tiny", &prompts, 64, 7)?)
}

fn spec_cfg(gamma: usize, max_tokens: usize, sampler: SamplerConfig, seed: u64, pruning: Pruning) -> SpecConfig {
    SpecConfig { gamma, max_tokens, sampler, seed, stop_tokens: vec![], prefill_step: 2048, pruning }
}

struct Target {
    name: &'static str,
    dir: PathBuf,
}

fn targets(root: &Path) -> Result<Vec<Target>> {
    let a = write_random_checkpoint(&root.join("tiny-a-bf16"), &tiny_config_a(), 1234, Dtype::Bf16, 1, true)?;
    let a_q4 = quantize_checkpoint(&a, &root.join("tiny-a-q4"), 4, 64, true)?;
    let b = write_random_checkpoint(&root.join("tiny-b-f32"), &tiny_config_b(), 4321, Dtype::F32, 1, true)?;
    let b16 = write_random_checkpoint(&root.join("tiny-b-bf16"), &tiny_config_b(), 4321, Dtype::Bf16, 1, true)?;
    let b_q4 = quantize_checkpoint(&b16, &root.join("tiny-b-q4"), 4, 64, true)?;
    Ok(vec![
        Target { name: "A bf16", dir: a },
        Target { name: "A q4", dir: a_q4 },
        Target { name: "B f32 (MoE)", dir: b },
        Target { name: "B q4 (MoE)", dir: b_q4 },
    ])
}

/// Greedy parity over targets × drafters × γ × pruning.
pub fn greedy_parity(root: &Path, tokens: usize) -> Result<()> {
    println!("\n## greedy-parity ({tokens} tokens, prompt of 21 tokens, sliding window 8)\n");
    println!("| target | drafter | γ | pruning | tokens matched | drafted | accepted | τ | host syncs/round |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    let mut self_accepted = 0;
    let mut dspark_drafted = 0;
    let mut fitted_accepted = 0;
    for t in targets(root)? {
        let model = Model::load(&t.dir).with_context(|| format!("loading {}", t.dir.display()))?;
        let p = prompt(21, model.config().vocab_size as u32);
        let plain = generate(&model, &p, &spec_cfg(1, tokens, SamplerConfig::greedy(), 0, Pruning::Off).plain(), |_| {})?.tokens;
        let cfg = model.config();
        let n = cfg.num_hidden_layers;
        let ds_opts = SyntheticDeepSpec { block_size: 7, target_layer_ids: vec![1, n / 2, n - 1], ..SyntheticDeepSpec::default() };
        let ds_dir = write_synthetic_deepspec(&root.join(format!("deepspec-{}", t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t"))), cfg, &ds_opts)?;
        let fitted = fitted_dspark(&model)?;
        let fitted_dir = fitted.save(&root.join(format!("fitted-{}", t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t"))), true)?;
        for gamma in [1usize, 3, 7] {
            let mut drafters: Vec<(String, Box<dyn Drafter>, Vec<Pruning>)> = vec![
                ("dspark (random init)".into(), Box::new(random_dspark(cfg, 7, 7)?), vec![Pruning::Off, Pruning::MinConf(0.5)]),
                ("dspark (bigram-fitted)".into(), Box::new(DSparkDrafter::load(&fitted_dir, cfg)?), vec![Pruning::Off, Pruning::MinConf(0.3)]),
                ("deepspec (synthetic)".into(), Box::new(DeepSpecDrafter::load(&ds_dir, cfg)?), vec![Pruning::Off, Pruning::MinConf(0.5)]),
                ("self (target continuation)".into(), Box::new(SelfDrafter::new(7)), vec![Pruning::Off]),
            ];
            for (name, drafter, prunings) in drafters.iter_mut() {
                for pruning in prunings.iter() {
                    let cfg = spec_cfg(gamma, tokens, SamplerConfig::greedy(), 0, pruning.clone());
                    let out = speculative_generate(&model, drafter.as_mut(), &p, &cfg, |_| {})?;
                    let matched = out.tokens.iter().zip(&plain).take_while(|(a, b)| a == b).count();
                    let ok = out.tokens == plain;
                    let s = &out.stats;
                    println!(
                        "| {} | {} | {gamma} | {} | {matched}/{} {} | {} | {} | {:.2} | {:.2} |",
                        t.name,
                        name,
                        match pruning {
                            Pruning::Off => "off".to_string(),
                            Pruning::MinConf(c) => format!("min_conf {c}"),
                            other => format!("{other:?}"),
                        },
                        plain.len(),
                        if ok { "" } else { "MISMATCH" },
                        s.drafted,
                        s.accepted,
                        s.tau(),
                        s.syncs_per_round()
                    );
                    if !ok {
                        failures.push(format!("{} / {name} / γ={gamma} / {pruning:?}", t.name));
                    }
                    if name.starts_with("self") {
                        self_accepted += s.accepted;
                    } else if name.contains("fitted") {
                        fitted_accepted += s.accepted;
                    } else {
                        dspark_drafted += s.drafted;
                    }
                }
            }
        }
    }
    println!(
        "\ngreedy-parity: accepted drafts: self-drafter {self_accepted}, bigram-fitted DSpark {fitted_accepted}; random-init drafters verified {dspark_drafted} drafts"
    );
    if self_accepted == 0 || fitted_accepted == 0 {
        bail!("greedy-parity is vacuous: no draft was ever accepted");
    }
    if !failures.is_empty() {
        bail!("greedy-parity FAILED for: {}", failures.join(", "));
    }
    println!("greedy-parity passed");
    Ok(())
}

fn quantize(src: &Path, bits: u32, group: u32) -> Result<PathBuf> {
    let dst = drafter_quant::default_out_dir(src, bits, group);
    let opts = drafter_quant::QuantizeOptions { bits, group_size: group, force: true, smoke: drafter_quant::Smoke::Off, ..Default::default() };
    Ok(drafter_quant::quantize_drafter(src, &dst, &opts, &mut |_| {})?.out_dir)
}

/// Greedy parity with quantized drafters, and their acceptance against the bf16 originals.
pub fn quantized_drafters(root: &Path, tokens: usize) -> Result<()> {
    println!("\n## greedy-parity with quantized drafters ({tokens} tokens)\n");
    println!("| target | drafter | weights | size | γ | tokens matched | accepted / drafted | τ | τ vs source |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for t in targets(root)?.into_iter().filter(|t| t.name.starts_with("A bf16") || t.name.starts_with("B q4")) {
        let model = Model::load(&t.dir)?;
        let cfg = model.config();
        let p = prompt(21, cfg.vocab_size as u32);
        let plain = generate(&model, &p, &spec_cfg(1, tokens, SamplerConfig::greedy(), 0, Pruning::Off).plain(), |_| {})?.tokens;
        let n = cfg.num_hidden_layers;
        let tag = t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t").to_string();
        let opts = SyntheticDeepSpec { block_size: 7, markov_rank: 64, target_layer_ids: vec![1, n / 2, n - 1], ..SyntheticDeepSpec::default() };
        let ds = write_synthetic_deepspec(&root.join(format!("q-deepspec-{tag}")), cfg, &opts)?;
        let fitted = fitted_dspark(&model)?.save(&root.join(format!("q-fitted-{tag}")), true)?;
        for (name, src, group) in [("dspark (bigram-fitted)", fitted, 32u32), ("deepspec (synthetic)", ds, 64u32)] {
            let variants = [(None, "source"), (Some(8u32), "8-bit"), (Some(4u32), "4-bit")];
            for gamma in [3usize, 7] {
                let mut base_tau = None;
                for (bits, label) in variants {
                    let dir = match bits {
                        None => src.clone(),
                        Some(b) => quantize(&src, b, group)?,
                    };
                    let mut d = spec_decode::loader::load_drafter(&dir, cfg)?;
                    let out = speculative_generate(&model, d.as_mut(), &p, &spec_cfg(gamma, tokens, SamplerConfig::greedy(), 0, Pruning::Off), |_| {})?;
                    let ok = out.tokens == plain;
                    let matched = out.tokens.iter().zip(&plain).take_while(|(a, b)| a == b).count();
                    let tau = out.stats.tau();
                    let base = *base_tau.get_or_insert(tau);
                    println!(
                        "| {} | {name} | {label}{} | {} | {gamma} | {matched}/{} {} | {}/{} | {tau:.2} | {:+.2} |",
                        t.name,
                        bits.map(|_| format!(" g{group}")).unwrap_or_default(),
                        drafter_quant::human_bytes(dir_bytes(&dir)),
                        plain.len(),
                        if ok { "" } else { "MISMATCH" },
                        out.stats.accepted,
                        out.stats.drafted,
                        tau - base
                    );
                    if !ok {
                        failures.push(format!("{} / {name} / {label} / γ={gamma}", t.name));
                    }
                }
            }
        }
    }
    if !failures.is_empty() {
        bail!("greedy-parity with quantized drafters FAILED for: {}", failures.join(", "));
    }
    println!("\ngreedy-parity with quantized drafters passed");
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| it.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors")).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

/// The exact joint law of the first two tokens, plus plain samples drawn as plain decoding does.
struct PlainLaw {
    joint: Vec<f64>,
    samples: Vec<usize>,
}

fn plain_law(model: &Model, prompt: &[u32], sampler: &SamplerConfig, n: usize, seed: u64) -> Result<PlainLaw> {
    let v = model.config().vocab_size;
    let mut cache = model.new_cache();
    let logits1 = plain_prefill(model, &mut cache, prompt, 2048)?; // [1, V]
    let p1 = probabilities(&logits1, sampler)?.to_f32_vec()?;
    let mut rows2 = Vec::with_capacity(v);
    let mut lp2 = Vec::with_capacity(v);
    for t in 0..v as u32 {
        let mut c = cache.clone();
        let l = step_logits(model, &mut c, &Array::from_slice(&[t], &[1, 1])?)?;
        rows2.push(probabilities(&l, sampler)?.to_f32_vec()?);
        lp2.push(logprobs(&l)?);
    }
    let mut joint = vec![0f64; v * v];
    for a in 0..v {
        for b in 0..v {
            joint[a * v + b] = p1[a] as f64 * rows2[a][b] as f64;
        }
    }
    // Plain decoding, batched over n independent requests: the sampler's own pipeline.
    let mut s = Sampler::new(sampler.clone(), seed)?;
    let lp1 = logprobs(&logits1)?.broadcast_to(&[n as i32, v as i32])?;
    let t1 = s.sample(&lp1)?.astype(Dtype::U32)?;
    let table = mlx_core::concatenate(&lp2, 0)?; // [V, V]
    let t2 = s.sample(&table.take(&t1, 0)?)?.astype(Dtype::U32)?;
    let (t1, t2) = (t1.to_vec::<u32>()?, t2.to_vec::<u32>()?);
    let samples = t1.iter().zip(&t2).map(|(&a, &b)| a as usize * v + b as usize).collect();
    Ok(PlainLaw { joint, samples })
}

fn counts(samples: &[usize], cells: usize) -> Vec<usize> {
    let mut c = vec![0; cells];
    for &s in samples {
        c[s] += 1;
    }
    c
}

/// Distribution equality of speculative sampling.
pub fn distribution_equality(root: &Path, n: usize) -> Result<()> {
    let mut json = tiny_config_a().to_json_value();
    json["vocab_size"] = 16.into();
    json["vocab_size_per_layer_input"] = 16.into();
    let cfg = TextConfig::from_json_str(&json.to_string())?;
    let dir = write_random_checkpoint(&root.join("tiny-vocab16"), &cfg, 99, Dtype::Bf16, 1, true)?;
    let model = Model::load(&dir)?;
    let v = cfg.vocab_size;
    let prompt = [4u32, 9, 5, 12];
    let mut drafter = random_dspark(&cfg, 3, 11)?;
    let pre = prefill(&model, &drafter.taps(), &prompt, 2048)?;
    println!("\n## distribution-equality (vocab {v}, N = {n} per arm ({} for the broken verifier), first two tokens, α = {ALPHA})\n", (n / 4).max(1000));
    println!("| T | filters | verifier | GOF χ² (df) | GOF p | vs plain χ² (df) | vs plain p | acceptance | verdict |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let conditions = [
        (0.7f32, false, VerifyRule::Exact),
        (1.0, false, VerifyRule::Exact),
        (0.7, true, VerifyRule::Exact),
        (1.0, true, VerifyRule::Exact),
        (1.0, false, VerifyRule::AcceptAll),
    ];
    let mut failures = Vec::new();
    for (ci, (temp, filters, rule)) in conditions.iter().enumerate() {
        let sampler = SamplerConfig {
            temperature: *temp,
            top_k: if *filters { 6 } else { 0 },
            top_p: if *filters { 0.9 } else { 0.0 },
            ..Default::default()
        };
        let law = plain_law(&model, &prompt, &sampler, n, 1_000_000 + ci as u64)?;
        let t0 = Instant::now();
        // The broken verifier is rejected overwhelmingly; a quarter of the samples shows it.
        let n_spec = if *rule == VerifyRule::AcceptAll { (n / 4).max(1000) } else { n };
        let mut spec = Vec::with_capacity(n_spec);
        let (mut drafted, mut accepted) = (0, 0);
        for i in 0..n_spec {
            // Three tokens, so the first round verifies two drafts (positions 0 and 1).
            let c = spec_cfg(3, 3, sampler.clone(), (ci * n + i) as u64, Pruning::Off);
            let out = decode_from(&model, &mut drafter, &pre, &c, *rule, |_| {})?;
            if out.tokens.len() < 2 {
                bail!("a speculative sample emitted {} tokens, expected 3", out.tokens.len());
            }
            drafted += out.stats.drafted;
            accepted += out.stats.accepted;
            spec.push(out.tokens[0] as usize * v + out.tokens[1] as usize);
        }
        let secs = t0.elapsed().as_secs_f64();
        let bins = chisq::bins(&law.joint, n);
        let gof = chisq::goodness_of_fit(&counts(&spec, v * v), &law.joint, &bins);
        let hom = chisq::homogeneity(&counts(&spec, v * v), &counts(&law.samples, v * v), &bins);
        let broken = *rule == VerifyRule::AcceptAll;
        let rejects = gof.p < ALPHA || hom.p < ALPHA;
        let ok = if broken { gof.p < ALPHA && hom.p < ALPHA } else { !rejects };
        println!(
            "| {temp} | {} | {} | {:.1} ({}) | {:.3e} | {:.1} ({}) | {:.3e} | {:.1}% | {} |",
            if *filters { "top-k 6, top-p 0.9" } else { "off" },
            if broken { "BROKEN (accept all)" } else { "exact" },
            gof.stat,
            gof.df,
            gof.p,
            hom.stat,
            hom.df,
            hom.p,
            100.0 * accepted as f64 / drafted.max(1) as f64,
            match (broken, ok) {
                (false, true) => "not rejected (ok)",
                (false, false) => "REJECTED",
                (true, true) => "rejected (ok: the test has power)",
                (true, false) => "NOT REJECTED (no power)",
            }
        );
        eprintln!("distribution-equality: condition {ci} took {secs:.1} s for {n_spec} speculative samples");
        if !ok {
            failures.push(format!("T={temp} filters={filters} rule={rule:?}"));
        }
    }
    if !failures.is_empty() {
        bail!("distribution-equality FAILED for: {}", failures.join(", "));
    }
    println!("\ndistribution-equality passed");
    Ok(())
}
