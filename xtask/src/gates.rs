//! `cargo xtask gates`: the losslessness gates of speculative decoding.
//!
//! - greedy-parity: speculative greedy output == plain greedy output, token for token, for every
//!   tiny target (bf16, 4-bit, MoE), drafter (random-init DSpark, the target's own continuation)
//!   and γ ∈ {1, 3, 7}, with confidence pruning on and off, decoding far past the sliding window.
//!   It fails if no draft was accepted (a vacuous gate).
//! - distribution-equality: with a tiny-vocabulary target, the joint law of the first two emitted
//!   tokens under speculative sampling equals plain sampling (χ² goodness of fit against the exact
//!   law and χ² homogeneity against plain samples, α = 0.001), at T ∈ {0.7, 1.0} with filters on
//!   and off, confidence pruning on in two of the four, and at T = 1 with a `logit_bias` on
//!   tokens the drafter likes and tokens it does not; and the same test rejects a
//!   deliberately broken verifier (accept every draft).
//! - quantized-drafters: greedy parity with 4- and 8-bit quantizations of a bigram-fitted DSpark
//!   and a synthetic DeepSpec drafter, and their acceptance against the unquantized source on
//!   the same prompts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use gemma4::checkpoint::{quantize_checkpoint, write_random_checkpoint};
use gemma4::config::{tiny_config_a, tiny_config_b, tiny_config_moe_top8, tiny_dense_config};
use gemma4::generate::{generate, prefill as plain_prefill, step_logits, GenerateConfig};
use gemma4::sampling::{biased_logprobs, Sampler, SamplerConfig};
use gemma4::{Model, TextConfig};
use mlx_core::{Array, Dtype};
use spec_decode::decode::{decode_from, prefill, Prefilled};
use spec_decode::deepspec::DeepSpecDrafter;
use spec_decode::dspark::{fit_bigram_drafter, DSparkConfig, DSparkDrafter};
use spec_decode::oracle::SelfDrafter;
use spec_decode::probs::composed_probabilities as probabilities;
use spec_decode::testing::{decode_from_with_rule, ScriptedConfidence, VerifyRule};
use spec_decode::testing::{write_synthetic_deepspec, SyntheticDeepSpec};
use spec_decode::{speculative_generate, Drafter, Pruning, SpecConfig};

use crate::chisq;

pub(crate) const ALPHA: f64 = 0.001;

fn prompt(n: usize, vocab: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11) % (vocab - 4)).collect()
}

/// A random-init DSpark drafter of `n_layers` for `target` with random Markov/confidence heads,
/// so drafts, Markov bias and pruning are all exercised.
pub fn random_dspark(target: &TextConfig, gamma: usize, n_layers: usize, seed: u64) -> Result<DSparkDrafter> {
    let n = target.num_hidden_layers;
    let cfg = DSparkConfig {
        gamma,
        d_draft: 64,
        n_layers,
        n_heads: 4,
        markov_rank: 32,
        ff_mult: 2,
        tap_layers: vec![1, n / 2, n],
        seq_head: None,
        sts: None,
        ctx_window: None,
        conf_law: false,
        greedy_head: false,
    };
    Ok(DSparkDrafter::init(cfg, target, "tiny", seed, true)?)
}

/// A DSpark drafter fitted by counting the target's greedy bigrams on 8 prompts (not the gate's).
fn fitted_dspark(model: &Model) -> Result<DSparkDrafter> {
    let v = model.config().vocab_size as u32;
    let prompts: Vec<Vec<u32>> =
        (0..8u32).map(|i| prompt(6, v).iter().map(|x| 4 + (x + i * 53) % (v - 4)).collect()).collect();
    Ok(fit_bigram_drafter(model, "tiny", &prompts, 64, 7)?)
}

/// A DSpark drafter trained by this project's pipeline (the target's own continuations as
/// tapped shards, then `train::drafter_train`), once per gate root: `<root>/trained-NAME/best`.
fn trained_dspark(model: &Model, root: &Path, name: &str) -> Result<PathBuf> {
    use gemma4::generate::ids_array;
    use train::drafter_train::{train_drafter, DrafterTrainConfig};
    use train::shards::{write_shard, Sequence, TargetId};
    let dir = root.join(format!("trained-{name}"));
    let best = dir.join("run/best");
    if best.join("dspark.json").is_file() {
        return Ok(best);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (v, n) = (model.config().vocab_size as u32, model.config().num_hidden_layers);
    let cfg = DSparkConfig { gamma: 7, d_draft: 32, n_layers: 1, ..DSparkConfig::with_taps(vec![n / 2, n]) };
    let taps = cfg.tap_set(n);
    for s in 0..4u32 {
        let seqs = (0..3u32)
            .map(|i| -> Result<Sequence> {
                let p: Vec<u32> = (0..6).map(|j| 4 + ((s * 3 + i) * 97 + j * 31) % (v - 4)).collect();
                let gen = GenerateConfig { max_tokens: 40, ..Default::default() };
                let ids = [p.clone(), generate(model, &p, &gen, |_| {})?.tokens].concat();
                let rows = model.forward_tapped(&ids_array(&ids)?, None, &taps)?.taps.context("no taps")?;
                Ok(Sequence { resp_start: p.len(), rows: rows.squeeze(0)?, ids })
            })
            .collect::<Result<Vec<_>>>()?;
        write_shard(&dir.join("data"), s as usize, &TargetId::of(model.config()), &cfg.tap_layers, &seqs)?;
    }
    let init = DSparkDrafter::init(cfg, model.config(), name, 3, false)?;
    let tc = DrafterTrainConfig {
        steps: 120,
        batch: 16,
        lr: 1e-2,
        warmup: 10,
        max_ctx: 32,
        eval_every: 40,
        eval_batches: 2,
        ..Default::default()
    };
    let r = train_drafter(model, &init, &[dir.join("data")], &dir.join("run"), &tc, false, |_| {})?;
    println!(
        "trained drafter for {name}: {} steps, loss {:.3} -> {:.3}, validation τ {:.3} -> {:.3}",
        r.steps,
        r.first_loss,
        r.last_loss,
        r.initial.tau,
        r.best.as_ref().map_or(f64::NAN, |b| b.tau)
    );
    Ok(r.best_dir)
}

fn spec_cfg(gamma: usize, max_tokens: usize, sampler: SamplerConfig, seed: u64, pruning: Pruning) -> SpecConfig {
    let generate = GenerateConfig { max_tokens, sampler, seed, ..Default::default() };
    SpecConfig { generate, gamma: Some(gamma), pruning }
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
    // Top-8 of 16 experts: a batched verify of 8 rows routes 64 (token, expert) pairs, where
    // MLX switches to sorted expert kernels; the stepwise verify must not.
    // f32: MLX's CPU gather_mm (dense experts) supports only float32.
    let moe8 = write_random_checkpoint(&root.join("tiny-moe-top8"), &tiny_config_moe_top8(), 77, Dtype::F32, 1, true)?;
    Ok(vec![
        Target { name: "A bf16", dir: a },
        Target { name: "A q4", dir: a_q4 },
        Target { name: "B f32 (MoE)", dir: b },
        Target { name: "B q4 (MoE)", dir: b_q4 },
        Target { name: "MoE top-8 f32", dir: moe8 },
    ])
}

/// How a table row names a pruning setting.
fn pruning_label(p: &Pruning) -> String {
    match p {
        Pruning::Off => "off".to_string(),
        Pruning::MinConf(c) => format!("min_conf {c}"),
        other => format!("{other:?}"),
    }
}

/// The embedded default (trained target and drafter) on a held-out prompt, computed in f32
/// (`auto`) and as stored (bf16), decoding well past its sliding window: the rows of the
/// table, then (accepted drafts, failures).
fn default_pair_parity(tokens: usize) -> Result<(usize, Vec<String>)> {
    let dir = engine::default_model::ensure(false)?;
    let ddir = engine::default_model::ensure_drafter(false)?;
    let p = crate::train_default::test_prompt_ids(&dir, 1)?.1.remove(0);
    let (mut accepted, mut failures) = (0, Vec::new());
    for dtype in [gemma4::ComputeDtype::Auto, gemma4::ComputeDtype::Stored] {
        let (model, resolved) = Model::load_as(&dir, dtype, mlx_core::Device::default_device()?)?;
        let window = model.config().sliding_window;
        // Past the window: the prompt plus at least twice the window.
        let n = tokens.max(2 * window + 8);
        let plain =
            generate(&model, &p, &spec_cfg(1, n, SamplerConfig::greedy(), 0, Pruning::Off).generate, |_| {})?.tokens;
        let mut drafter = spec_decode::load_drafter(&ddir, model.config())?;
        let own = drafter.gamma();
        for (gamma, pruning) in [(own, Pruning::Off), (3, Pruning::Off), (own, Pruning::MinConf(0.5))] {
            let cfg = spec_cfg(gamma, n, SamplerConfig::greedy(), 0, pruning.clone());
            let out = speculative_generate(&model, drafter.as_mut(), &p, &cfg, |_| {})?;
            let matched = out.tokens.iter().zip(&plain).take_while(|(a, b)| a == b).count();
            let ok = out.tokens == plain;
            let s = &out.stats;
            println!(
                "| default ({}; {} prompt tokens, window {window}) | dspark (trained default) | {gamma} | {} | {matched}/{} {} | {} | {} | {:.2} | {:.2} |",
                resolved.describe(),
                p.len(),
                pruning_label(&pruning),
                plain.len(),
                if ok { "" } else { "MISMATCH" },
                s.drafted,
                s.accepted,
                s.tau(),
                s.syncs_per_round()
            );
            accepted += s.accepted;
            if !ok {
                failures.push(format!("default pair / {} / γ={gamma} / {pruning:?}", resolved.describe()));
            }
        }
    }
    Ok((accepted, failures))
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
    let mut pruned_accepted = 0;
    // Pruned runs that verified fewer drafts than the same drafter unpruned (pruning did cut).
    let mut pruning_cut = 0;
    for t in targets(root)? {
        let mut target_accepted = 0;
        let model = Model::load(&t.dir).with_context(|| format!("loading {}", t.dir.display()))?;
        let p = prompt(21, model.config().vocab_size as u32);
        let plain =
            generate(&model, &p, &spec_cfg(1, tokens, SamplerConfig::greedy(), 0, Pruning::Off).generate, |_| {})?
                .tokens;
        let cfg = model.config();
        let n = cfg.num_hidden_layers;
        let ds_opts = SyntheticDeepSpec {
            block_size: 7,
            target_layer_ids: vec![1, n / 2, n - 1],
            ..SyntheticDeepSpec::default()
        };
        let ds_dir = write_synthetic_deepspec(
            &root.join(format!("deepspec-{}", t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t"))),
            cfg,
            &ds_opts,
        )?;
        // A drafter trained by the project's own pipeline joins on the first target.
        let trained_dir = if t.name == "A bf16" { Some(trained_dspark(&model, root, "tiny-a-bf16")?) } else { None };
        let fitted = fitted_dspark(&model)?;
        let fitted_dir = fitted
            .save(&root.join(format!("fitted-{}", t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t"))), true)?;
        for gamma in [1usize, 3, 7] {
            let mut drafters: Vec<(String, Box<dyn Drafter>, Vec<Pruning>)> = vec![
                (
                    "dspark (random init)".into(),
                    Box::new(random_dspark(cfg, 7, 2, 7)?),
                    vec![Pruning::Off, Pruning::MinConf(0.5)],
                ),
                (
                    "dspark (bigram-fitted)".into(),
                    Box::new(DSparkDrafter::load(&fitted_dir, cfg)?),
                    vec![Pruning::Off, Pruning::MinConf(0.3)],
                ),
                (
                    "deepspec (synthetic)".into(),
                    Box::new(DeepSpecDrafter::load(&ds_dir, cfg)?),
                    vec![Pruning::Off, Pruning::MinConf(0.5)],
                ),
                ("self (target continuation)".into(), Box::new(SelfDrafter::new(7)), vec![Pruning::Off]),
            ];
            if let Some(dir) = &trained_dir {
                drafters.push((
                    "dspark (trained)".into(),
                    Box::new(DSparkDrafter::load(dir, cfg)?),
                    vec![Pruning::Off, Pruning::MinConf(0.3)],
                ));
            }
            for (name, drafter, prunings) in drafters.iter_mut() {
                let mut unpruned_drafted = None;
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
                        pruning_label(pruning),
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
                    target_accepted += s.accepted;
                    if pruning.is_active() {
                        pruned_accepted += s.accepted;
                        pruning_cut += usize::from(unpruned_drafted.is_some_and(|u| s.drafted < u));
                    } else {
                        unpruned_drafted = Some(s.drafted);
                    }
                }
            }
        }
        if target_accepted == 0 {
            failures.push(format!("{}: vacuous, no draft was accepted on this target", t.name));
        }
    }
    let (default_accepted, default_failures) = default_pair_parity(tokens)?;
    failures.extend(default_failures);
    if default_accepted == 0 {
        failures.push("the embedded default pair: vacuous, no draft was accepted".into());
    }
    println!(
        "\ngreedy-parity: accepted drafts: self-drafter {self_accepted}, bigram-fitted DSpark {fitted_accepted}, with pruning on {pruned_accepted}; random-init drafters verified {dspark_drafted} drafts; {pruning_cut} pruned runs verified fewer drafts than unpruned"
    );
    if self_accepted == 0 || fitted_accepted == 0 || pruned_accepted == 0 || pruning_cut == 0 {
        bail!("greedy-parity is vacuous: a drafter kind or the pruned runs never had a draft accepted, or pruning never cut a block");
    }
    if !failures.is_empty() {
        bail!("greedy-parity FAILED for: {}", failures.join(", "));
    }
    println!("greedy-parity passed");
    Ok(())
}

fn quantize(src: &Path, bits: u32, group: u32) -> Result<PathBuf> {
    let dst = drafter_quant::default_out_dir(src, bits, group);
    let opts = drafter_quant::QuantizeOptions {
        bits,
        group_size: group,
        force: true,
        smoke: drafter_quant::Smoke::Off,
        ..Default::default()
    };
    Ok(drafter_quant::quantize_drafter(src, &dst, &opts, &mut |_| {})?.out_dir)
}

/// Greedy parity with quantized drafters, and their acceptance against the unquantized source
/// on the same prompts.
pub fn quantized_drafters(root: &Path, tokens: usize) -> Result<()> {
    println!("\n## greedy-parity with quantized drafters ({tokens} tokens, 3 prompts)\n");
    println!("| target | drafter | weights | size | γ | tokens matched | accepted / drafted | τ | τ vs source |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    let mut quantized_accepted = 0;
    for t in targets(root)?.into_iter().filter(|t| t.name.starts_with("A bf16") || t.name.starts_with("B q4")) {
        let model = Model::load(&t.dir)?;
        let cfg = model.config();
        let v = cfg.vocab_size as u32;
        let prompts: Vec<Vec<u32>> =
            (0..3u32).map(|i| prompt(21, v).iter().map(|x| 4 + (x + i * 97) % (v - 4)).collect()).collect();
        let plain: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                Ok(generate(
                    &model,
                    p,
                    &spec_cfg(1, tokens, SamplerConfig::greedy(), 0, Pruning::Off).generate,
                    |_| {},
                )?
                .tokens)
            })
            .collect::<Result<_>>()?;
        let n = cfg.num_hidden_layers;
        let tag = t.dir.file_name().and_then(|f| f.to_str()).unwrap_or("t").to_string();
        let opts = SyntheticDeepSpec {
            block_size: 7,
            markov_rank: 64,
            target_layer_ids: vec![1, n / 2, n - 1],
            ..SyntheticDeepSpec::default()
        };
        let ds = write_synthetic_deepspec(&root.join(format!("q-deepspec-{tag}")), cfg, &opts)?;
        let fitted = fitted_dspark(&model)?.save(&root.join(format!("q-fitted-{tag}")), true)?;
        for (name, src, group) in [("dspark (bigram-fitted)", fitted, 32u32), ("deepspec (synthetic)", ds, 64u32)] {
            let variants =
                [(None, src.clone()), (Some(8u32), quantize(&src, 8, group)?), (Some(4u32), quantize(&src, 4, group)?)];
            for gamma in [3usize, 7] {
                let mut base_tau = None;
                for (bits, dir) in &variants {
                    let mut d = spec_decode::loader::load_drafter(dir, cfg)?;
                    let (mut matched, mut total, mut stats) = (0, 0, spec_decode::SpecStats::default());
                    for (p, want) in prompts.iter().zip(&plain) {
                        let c = spec_cfg(gamma, tokens, SamplerConfig::greedy(), 0, Pruning::Off);
                        let out = speculative_generate(&model, d.as_mut(), p, &c, |_| {})?;
                        matched += out.tokens.iter().zip(want).take_while(|(a, b)| a == b).count();
                        total += want.len();
                        if out.tokens != *want {
                            failures.push(format!("{} / {name} / {bits:?} bits / γ={gamma}", t.name));
                        }
                        stats.absorb(&out.stats);
                    }
                    if bits.is_some() {
                        quantized_accepted += stats.accepted;
                    }
                    let tau = stats.tau();
                    let base = *base_tau.get_or_insert(tau);
                    println!(
                        "| {} | {name} | {} | {} | {gamma} | {matched}/{total} {} | {}/{} | {tau:.2} | {:+.2} |",
                        t.name,
                        bits.map(|b| format!("{b}-bit g{group}")).unwrap_or_else(|| "source".into()),
                        drafter_quant::human_bytes(dir_bytes(dir)),
                        if matched == total { "" } else { "MISMATCH" },
                        stats.accepted,
                        stats.drafted,
                        tau - base
                    );
                }
            }
        }
    }
    if !failures.is_empty() {
        bail!("greedy-parity with quantized drafters FAILED for: {}", failures.join(", "));
    }
    if quantized_accepted == 0 {
        bail!("greedy-parity with quantized drafters is vacuous: no quantized draft was ever accepted");
    }
    println!("\ngreedy-parity with quantized drafters passed ({quantized_accepted} quantized drafts accepted)");
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|it| {
            it.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// The exact joint law of the first two tokens, plus plain samples drawn as plain decoding does.
pub(crate) struct PlainLaw {
    pub(crate) joint: Vec<f64>,
    pub(crate) samples: Vec<usize>,
}

pub(crate) fn plain_law(
    model: &Model,
    prompt: &[u32],
    sampler: &SamplerConfig,
    n: usize,
    seed: u64,
) -> Result<PlainLaw> {
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
        lp2.push(biased_logprobs(&l, sampler)?);
    }
    let mut joint = vec![0f64; v * v];
    for a in 0..v {
        for b in 0..v {
            joint[a * v + b] = p1[a] as f64 * rows2[a][b] as f64;
        }
    }
    // Plain decoding, batched over n independent requests: the sampler's own pipeline.
    let mut s = Sampler::new(sampler.clone(), seed)?;
    let lp1 = biased_logprobs(&logits1, sampler)?.broadcast_to(&[n as i32, v as i32])?;
    let t1 = s.sample(&lp1)?.astype(Dtype::U32)?;
    let table = mlx_core::concatenate(&lp2, 0)?; // [V, V]
    let t2 = s.sample(&table.take(&t1, 0)?)?.astype(Dtype::U32)?;
    let (t1, t2) = (t1.to_vec::<u32>()?, t2.to_vec::<u32>()?);
    let samples = t1.iter().zip(&t2).map(|(&a, &b)| a as usize * v + b as usize).collect();
    Ok(PlainLaw { joint, samples })
}

/// Whether a condition passes: an exact one is rejected by neither test (goodness of fit to the
/// exact law, homogeneity with plain samples), a broken one by both.
pub(crate) fn judged(gof: &chisq::Test, hom: &chisq::Test, broken: bool) -> bool {
    if broken {
        gof.p < ALPHA && hom.p < ALPHA
    } else {
        gof.p >= ALPHA && hom.p >= ALPHA
    }
}

/// The two tests' columns: GOF χ² (df), GOF p, vs plain χ² (df), vs plain p.
pub(crate) fn test_cells(gof: &chisq::Test, hom: &chisq::Test) -> String {
    format!("{:.1} ({}) | {:.3e} | {:.1} ({}) | {:.3e}", gof.stat, gof.df, gof.p, hom.stat, hom.df, hom.p)
}

/// The verdict column: an exact condition must not be rejected, a broken one must be.
pub(crate) fn verdict_cell(broken: bool, ok: bool) -> &'static str {
    match (broken, ok) {
        (false, true) => "not rejected (ok)",
        (false, false) => "REJECTED",
        (true, true) => "rejected (ok: the test has power)",
        (true, false) => "NOT REJECTED (no power)",
    }
}

pub(crate) fn counts(samples: &[usize], cells: usize) -> Vec<usize> {
    let mut c = vec![0; cells];
    for &s in samples {
        c[s] += 1;
    }
    c
}

/// Verify costs v(1..=4) for the scheduler conditions: one draft pays only when its
/// confidence is above 0.5, a second one is nearly free.
pub(crate) const SCHEDULE_COST: [f32; 4] = [1.0, 1.5, 1.6, 1.7];

/// The scheduler gate's drafter: the first confidence is 0.4 (three rounds in four) or 0.8, a
/// coin of its own per round; the second is 0.99 after a first draft in `favoured` and 0.01
/// otherwise. Under [`SCHEDULE_COST`] the early-stopping schedule verifies no draft after 0.4,
/// and after 0.8 one draft, or two when the first is favoured; a look-ahead scheduler also
/// verifies two after 0.4 when the first draft is favoured (Θ(2) = 1.796 / 1.6 > 1), so
/// whether the first draft is verified then depends on its own value. With `favoured` = the
/// tokens the drafter over-proposes (q > p), that bias is large: the test must catch it.
pub(crate) fn scheduled_drafter<D: Drafter>(inner: D, favoured: Vec<u32>) -> ScriptedConfidence<D> {
    let later = Box::new(move |t: u32| if favoured.contains(&t) { 0.99 } else { 0.01 });
    ScriptedConfidence::new(inner, vec![0.4, 0.4, 0.4, 0.8], later, 0x5c4ed)
}

/// The first-token law when a draft is verified only if it lies in `set` and otherwise the token
/// is drawn from p: what a look-ahead scheduler does in [`scheduled_drafter`]'s low-confidence
/// rounds. Speculative sampling of d ∈ set: accept with min(1, p/q), else the residual.
fn selective_law(p: &[f64], q: &[f64], set: &[usize]) -> Vec<f64> {
    let residual: Vec<f64> = p.iter().zip(q).map(|(a, b)| (a - b).max(0.0)).collect();
    let mass: f64 = residual.iter().sum();
    let mut out: Vec<f64> = p.iter().map(|x| x * (1.0 - set.iter().map(|&d| q[d]).sum::<f64>())).collect();
    for &d in set {
        let accept = if q[d] > 0.0 { (p[d] / q[d]).min(1.0) } else { 1.0 };
        out[d] += q[d] * accept;
        if mass > 0.0 {
            for (o, r) in out.iter_mut().zip(&residual) {
                *o += q[d] * (1.0 - accept) * r / mass;
            }
        }
    }
    out
}

/// The favoured first drafts for the scheduler gate: of the sets made of the tokens the drafter
/// proposes most over their target probability (prefixes in order of q / p), the one whose
/// selective verification moves the first-token law furthest from p (χ² distance), so the
/// look-ahead's bias is as visible as this pair allows.
pub(crate) fn favoured_set(p: &[f64], q: &[f64]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..p.len()).filter(|&a| q[a] > 0.0).collect();
    order.sort_by(|&a, &b| (q[b] / p[b].max(1e-12)).total_cmp(&(q[a] / p[a].max(1e-12))));
    let distance = |set: &[usize]| -> f64 {
        selective_law(p, q, set).iter().zip(p).filter(|(_, &e)| e > 0.0).map(|(o, e)| (o - e).powi(2) / e).sum()
    };
    let best = (1..=order.len()).max_by(|&a, &b| distance(&order[..a]).total_cmp(&distance(&order[..b]))).unwrap_or(0);
    order[..best].iter().map(|&a| a as u32).collect()
}

/// The law q of the first draft after the prefilled prompt, under `sampler` // `[V]`.
pub(crate) fn first_draft_law(
    model: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    sampler: &SamplerConfig,
) -> Result<Vec<f32>> {
    let mut pre = pre.clone();
    let ctx = pre.take_ctx();
    drafter.reset(ctx.as_ref(), pre.committed())?;
    let anchor = Array::from_slice(&[pre.pending()], &[1])?;
    let mut keys = mlx_core::random::KeyChain::new(0)?;
    let req = spec_decode::DraftRequest {
        anchor: &anchor,
        position: pre.committed(),
        max_drafts: 1,
        sampling: spec_decode::DraftSampling::Sample { cfg: sampler, keys: &mut keys },
        target: model,
        target_cache: pre.cache(),
    };
    let q = drafter.propose(req)?.q.context("a sampled proposal without q")?;
    Ok(q.slice_axis(0, 0, 1)?.to_f32_vec()?)
}

/// The bias of the gate's `logit_bias` condition: on the two tokens the drafter's first draft
/// likes most, -3 and +1.5, and on the two it likes least, +4 and +2.5 (by the unbiased first
/// draft law under `sampler`), so the bias moves mass both toward and away from the drafts.
fn gate_logit_bias(
    model: &Model,
    drafter: &mut dyn Drafter,
    pre: &Prefilled,
    sampler: &SamplerConfig,
) -> Result<Vec<(u32, f32)>> {
    let q = first_draft_law(model, drafter, pre, sampler)?;
    let mut order: Vec<u32> = (0..q.len() as u32).collect();
    order.sort_by(|&a, &b| q[b as usize].total_cmp(&q[a as usize]));
    let (liked, disliked) = (&order[..2], &order[order.len() - 2..]);
    Ok(vec![(liked[0], -3.0), (liked[1], 1.5), (disliked[0], 4.0), (disliked[1], 2.5)])
}

/// Distribution equality of speculative sampling.
pub fn distribution_equality(root: &Path, n: usize) -> Result<()> {
    // The law under test is the verify rule's, not the architecture's (greedy-parity covers
    // that): a two-layer target (one sliding, one full) and a one-layer drafter keep the
    // 90,000 speculative samples affordable.
    let cfg = tiny_dense_config(128, 16, 2)?;
    let dir = write_random_checkpoint(&root.join("tiny-vocab16-2l"), &cfg, 99, Dtype::Bf16, 1, true)?;
    let model = Model::load(&dir)?;
    let v = cfg.vocab_size;
    let prompt = [4u32, 9, 5, 12];
    let mut drafter = random_dspark(&cfg, 3, 1, 11)?;
    let pre = prefill(&model, &drafter.taps(), &prompt, 2048)?;
    println!(
        "\n## distribution-equality (vocab {v}, N = {n} per arm ({} for the broken verifier, {} for the look-ahead scheduler and the logit bias), first two tokens, α = {ALPHA})\n",
        (n / 4).max(1000),
        (n / 8).max(1000)
    );
    println!("| T | filters | pruning | verifier | GOF χ² (df) | GOF p | vs plain χ² (df) | vs plain p | first rounds with 2 drafts | acceptance | verdict |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    // Pruning at the median confidence of block position 1 cuts about half of the two-draft
    // blocks, so both the pruned and the unpruned branch are sampled.
    let mut confs = Vec::new();
    for i in 0..200 {
        let c = spec_cfg(
            3,
            3,
            SamplerConfig { temperature: 1.0, ..Default::default() },
            7_000_000 + i,
            Pruning::Thresholds(vec![]),
        );
        let out = decode_from(&model, &mut drafter, &pre, &c, |_| {})?;
        confs.extend(out.conf_samples.iter().filter(|s| s.pos == 1).map(|s| s.conf));
    }
    confs.sort_by(f32::total_cmp);
    let median = confs.get(confs.len() / 2).copied().context("the drafter gave no position-1 confidences")?;
    // Pruning off is covered by the default pair's conditions below (first token, vocab 4096).
    // The throughput schedule runs on a scripted-confidence drafter (see `scheduled_drafter`):
    // with its early stop it must pass; picking the window after seeing every confidence must
    // be caught.
    let plan = spec_decode::ThroughputPlan::new(spec_decode::sts::Sts::identity(3), SCHEDULE_COST.to_vec());
    let conditions = [
        // T ≠ 1 without filters: the rows skip the logsumexp (spec_decode::probs).
        (0.8f64, false, Pruning::MinConf(median), VerifyRule::Exact, false),
        // Priced at a request rate of 1 token a step (the rate rule, which a request uses after
        // its first rounds): the same windows as the per-round ratio here (none after 0.4; one,
        // or two when the first draft is favoured, after 0.8), through the rate rule's code.
        (0.7, true, Pruning::Throughput(plan.clone().with_rate_seed(1.0)), VerifyRule::Exact, false),
        (0.7, true, Pruning::Throughput(plan.look_ahead()), VerifyRule::Exact, false),
        (1.0, false, Pruning::Off, VerifyRule::AcceptAll, false),
        // A logit bias changes p (and q): the law must be plain decoding's with that bias.
        (1.0, false, Pruning::Off, VerifyRule::Exact, true),
    ];
    let mut failures = Vec::new();
    for (ci, (temp, filters, pruning, rule, biased)) in conditions.iter().enumerate() {
        let look_ahead = matches!(pruning, Pruning::Throughput(p) if p.is_look_ahead());
        let biased = *biased;
        let mut sampler = SamplerConfig {
            temperature: *temp,
            top_k: if *filters { 6 } else { 0 },
            top_p: if *filters { 0.9 } else { 0.0 },
            ..Default::default()
        };
        if biased {
            sampler.logit_bias = gate_logit_bias(&model, &mut drafter, &pre, &sampler)?;
        }
        let law = plain_law(&model, &prompt, &sampler, n, 1_000_000 + ci as u64)?;
        let mut scripted = None;
        if matches!(pruning, Pruning::Throughput(_)) {
            // The first token's target law p (a marginal of the joint) against the draft law q.
            let q: Vec<f64> =
                first_draft_law(&model, &mut drafter, &pre, &sampler)?.iter().map(|&x| x as f64).collect();
            let p: Vec<f64> = (0..v).map(|a| (0..v).map(|b| law.joint[a * v + b]).sum()).collect();
            let favoured = favoured_set(&p, &q);
            scripted = Some(scheduled_drafter(random_dspark(&cfg, 3, 1, 11)?, favoured));
        }
        let drafter: &mut dyn Drafter = match scripted.as_mut() {
            Some(s) => s,
            None => &mut drafter,
        };
        let t0 = Instant::now();
        // A broken verifier or scheduler is rejected overwhelmingly; a quarter of the samples
        // shows it (an eighth for the look-ahead, rejected at p ≈ 1e-7 with 1000).
        let broken = *rule == VerifyRule::AcceptAll || look_ahead;
        // The bias condition checks one more law through the same verify: an eighth of the
        // samples (about 20 s at the default N) still rejects a p without the bias outright.
        let n_spec = if look_ahead || biased {
            (n / 8).max(1000)
        } else if broken {
            (n / 4).max(1000)
        } else {
            n
        };
        let mut spec = Vec::with_capacity(n_spec);
        let mut totals = spec_decode::SpecStats::default();
        for i in 0..n_spec {
            // Three tokens, so the first round verifies up to two drafts (positions 0 and 1).
            let c = spec_cfg(3, 3, sampler.clone(), (ci * n + i) as u64, pruning.clone());
            let out = decode_from_with_rule(&model, drafter, &pre, &c, *rule, |_| {})?;
            if out.tokens.len() < 2 {
                bail!("a speculative sample emitted {} tokens, expected 3", out.tokens.len());
            }
            totals.absorb(&out.stats);
            spec.push(out.tokens[0] as usize * v + out.tokens[1] as usize);
        }
        let secs = t0.elapsed().as_secs_f64();
        // Only a first round can verify two drafts; pruning must cut some of them, not all.
        let two_draft_share = totals.drafted_by_pos.get(1).copied().unwrap_or(0) as f64 / n_spec as f64;
        let cut_some_not_all = two_draft_share > 0.0 && two_draft_share < 1.0;
        let unpruned_all = two_draft_share == 1.0;
        if (pruning.is_active() && !cut_some_not_all) || (!pruning.is_active() && !unpruned_all) {
            failures.push(format!(
                "T={temp} pruning={pruning:?}: {:.1}% of first rounds verified two drafts",
                100.0 * two_draft_share
            ));
        }
        let bins = chisq::bins(&law.joint, n);
        let gof = chisq::goodness_of_fit(&counts(&spec, v * v), &law.joint, &bins);
        let hom = chisq::homogeneity(&counts(&spec, v * v), &counts(&law.samples, v * v), &bins);
        let ok = judged(&gof, &hom, broken);
        let filters_cell = if *filters {
            "top-k 6, top-p 0.9".to_string()
        } else if biased {
            format!("logit_bias {:?}", sampler.logit_bias)
        } else {
            "off".to_string()
        };
        println!(
            "| {temp} | {filters_cell} | {} | {} | {} | {:.1}% | {:.1}% | {} |",
            match pruning {
                Pruning::MinConf(c) => format!("min_conf {c:.3}"),
                Pruning::Throughput(_) if look_ahead => "throughput, LOOK-AHEAD (biased)".to_string(),
                Pruning::Throughput(_) => "throughput (early stop, priced at rate 1)".to_string(),
                _ => "off".to_string(),
            },
            if *rule == VerifyRule::AcceptAll { "BROKEN (accept all)" } else { "exact" },
            test_cells(&gof, &hom),
            100.0 * two_draft_share,
            100.0 * totals.acceptance_rate(),
            verdict_cell(broken, ok)
        );
        eprintln!("distribution-equality: condition {ci} took {secs:.1} s for {n_spec} speculative samples");
        if !ok {
            failures.push(format!("T={temp} filters={filters} pruning={pruning:?} rule={rule:?}"));
        }
        if !broken && totals.accepted == 0 {
            failures.push(format!("T={temp} filters={filters} pruning={pruning:?}: vacuous, no draft was accepted"));
        }
    }
    failures.extend(crate::distribution_batched::batched_conditions(&model, &cfg, &prompt, n)?);
    failures.extend(default_pair_distribution(n)?);
    if !failures.is_empty() {
        bail!("distribution-equality FAILED for: {}", failures.join(", "));
    }
    println!("\ndistribution-equality passed");
    Ok(())
}

/// Distribution equality on the embedded default pair (vocabulary 4096): the law of the first
/// emitted token, which the first round's verify decides (one draft, so the sample is cheap),
/// against the target's exact next-token law after a held-out prompt. χ² over the tokens with
/// an expected count of at least 5 plus one pooled "other" cell; then the same test must
/// reject a broken verifier that accepts every draft (its law is the drafter's).
pub fn default_pair_distribution(n: usize) -> Result<Vec<String>> {
    let dir = engine::default_model::ensure(false)?;
    let ddir = engine::default_model::ensure_drafter(false)?;
    let (model, resolved) = Model::load_as(&dir, gemma4::ComputeDtype::Auto, mlx_core::Device::default_device()?)?;
    let prompt = crate::train_default::test_prompt_ids(&dir, 1)?.1.remove(0);
    let mut drafter = spec_decode::load_drafter(&ddir, model.config())?;
    let pre = prefill(&model, &drafter.taps(), &prompt, 2048)?;
    let v = model.config().vocab_size;
    let mut cache = model.new_cache();
    let logits = plain_prefill(&model, &mut cache, &prompt, 2048)?; // [1, V]
    println!(
        "\n## distribution-equality on the default pair ({}; vocab {v}, first emitted token after a {}-token held-out prompt, α = {ALPHA})\n",
        resolved.describe(),
        prompt.len()
    );
    println!("| sampling | verifier | N | cells | GOF χ² (df) | p | acceptance | verdict |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    // One exact condition (the tiny gate above covers T = 1 and top-k); the broken verifier is
    // rejected overwhelmingly, so a quarter of the samples shows it.
    let conditions = [
        (
            "T=0.7 top-p 0.95",
            SamplerConfig { temperature: 0.7, top_p: 0.95, ..Default::default() },
            VerifyRule::Exact,
            n,
        ),
        ("T=1", SamplerConfig { temperature: 1.0, ..Default::default() }, VerifyRule::AcceptAll, (n / 4).max(1000)),
    ];
    for (ci, (name, sampler, rule, n_spec)) in conditions.into_iter().enumerate() {
        let law: Vec<f64> = probabilities(&logits, &sampler)?.to_f32_vec()?.into_iter().map(f64::from).collect();
        let t0 = Instant::now();
        let mut firsts = Vec::with_capacity(n_spec);
        let mut totals = spec_decode::SpecStats::default();
        for i in 0..n_spec {
            // Two tokens: the first round drafts one and verifies it.
            let c = spec_cfg(1, 2, sampler.clone(), 90_000_000 + (ci * n + i) as u64, Pruning::Off);
            let out = decode_from_with_rule(&model, drafter.as_mut(), &pre, &c, rule, |_| {})?;
            let first = *out.tokens.first().context("a speculative sample emitted no token")?;
            totals.absorb(&out.stats);
            firsts.push(first as usize);
        }
        let bins = chisq::bins(&law, n_spec);
        let gof = chisq::goodness_of_fit(&counts(&firsts, v), &law, &bins);
        let broken = rule == VerifyRule::AcceptAll;
        let ok = if broken { gof.p < ALPHA } else { gof.p >= ALPHA };
        println!(
            "| {name} | {} | {n_spec} | {} | {:.1} ({}) | {:.3e} | {:.1}% | {} |",
            if broken { "BROKEN (accept all)" } else { "exact" },
            bins.len(),
            gof.stat,
            gof.df,
            gof.p,
            100.0 * totals.acceptance_rate(),
            match (broken, ok) {
                (false, true) => "not rejected (ok)",
                (false, false) => "REJECTED",
                (true, true) => "rejected (ok: the test has power)",
                (true, false) => "NOT REJECTED (no power)",
            }
        );
        eprintln!("distribution-equality (default pair): {name} took {:.1} s", t0.elapsed().as_secs_f64());
        if !ok {
            failures.push(format!("default pair {name} rule={rule:?}"));
        }
        if !broken && totals.accepted == 0 {
            failures.push(format!("default pair {name}: vacuous, no draft was accepted"));
        }
    }
    Ok(failures)
}
