//! The distribution gate's batched conditions: speculative sampling run by the engine's batched
//! step ([`engine::batch::step`]), eight sessions sharing every target forward, with the batch
//! schedule choosing who drafts and every window across the sessions (Algorithm 1 across
//! requests). The law of each session's first two tokens must still be plain decoding's; and a
//! look-ahead scheduler run through the same batched step must still be caught.

use anyhow::{bail, Result};
use engine::batch::{step, BatchSchedule, Member};
use engine::{Request, Session};
use gemma4::generate::GenerateConfig;
use gemma4::sampling::SamplerConfig;
use gemma4::{Model, TextConfig};
use spec_decode::schedule::batch::BatchCost;
use spec_decode::{Drafter, Pruning, SpecStats};

use crate::chisq;
use crate::gates::{
    counts, favoured_set, first_draft_law, judged, plain_law, random_dspark, scheduled_drafter, test_cells,
    verdict_cell, SCHEDULE_COST,
};

/// Sessions per batch.
const GROUP: usize = 8;

/// Runs the batched conditions on the gate's tiny pair; returns the failures.
pub fn batched_conditions(model: &Model, cfg: &TextConfig, prompt: &[u32], n: usize) -> Result<Vec<String>> {
    let v = cfg.vocab_size;
    let sampler = SamplerConfig { temperature: 0.7, top_k: 6, top_p: 0.9, ..Default::default() };
    let law = plain_law(model, prompt, &sampler, n, 3_000_000)?;
    // The scripted drafter whose favoured first drafts make a look-ahead's bias visible (see
    // `gates::scheduled_drafter`).
    let mut probe = random_dspark(cfg, 3, 1, 11)?;
    let pre = spec_decode::decode::prefill(model, &probe.taps(), prompt, 2048)?;
    let q: Vec<f64> = first_draft_law(model, &mut probe, &pre, &sampler)?.iter().map(|&x| x as f64).collect();
    let p: Vec<f64> = (0..v).map(|a| (0..v).map(|b| law.joint[a * v + b]).sum()).collect();
    let favoured = favoured_set(&p, &q);
    let plan = spec_decode::ThroughputPlan::new(spec_decode::sts::Sts::identity(3), SCHEDULE_COST.to_vec());
    println!("\n### batched: {GROUP} sessions per target forward, the batch schedule choosing drafting and windows\n");
    println!("| T | filters | pruning | N | GOF χ² (df) | GOF p | vs plain χ² (df) | vs plain p | windows of 2 | acceptance | verdict |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for (name, pruning, broken) in [
        ("batch schedule (early stop)", Pruning::Throughput(plan.clone()), false),
        ("LOOK-AHEAD (biased)", Pruning::Throughput(plan.clone().look_ahead()), true),
    ] {
        let n_spec = if broken { (n / 8).max(1000) } else { n };
        let t0 = std::time::Instant::now();
        let (samples, stats) = sample(model, cfg, prompt, &sampler, &pruning, &favoured, n_spec, 4_000_000)?;
        let bins = chisq::bins(&law.joint, n);
        let gof = chisq::goodness_of_fit(&counts(&samples, v * v), &law.joint, &bins);
        let hom = chisq::homogeneity(&counts(&samples, v * v), &counts(&law.samples, v * v), &bins);
        let ok = judged(&gof, &hom, broken);
        let twos = stats.drafted_by_pos.get(1).copied().unwrap_or(0) as f64 / n_spec as f64;
        println!(
            "| 0.7 | top-k 6, top-p 0.9 | {name} | {n_spec} | {} | {:.1}% | {:.1}% | {} |",
            test_cells(&gof, &hom),
            100.0 * twos,
            100.0 * stats.acceptance_rate(),
            verdict_cell(broken, ok)
        );
        eprintln!(
            "distribution-equality: batched {name} took {:.1} s for {n_spec} samples",
            t0.elapsed().as_secs_f64()
        );
        if !ok {
            failures.push(format!("batched {name}"));
        }
        if !broken && stats.accepted == 0 {
            failures.push(format!("batched {name}: vacuous, no draft was accepted"));
        }
    }
    Ok(failures)
}

/// `n` samples of the first two tokens, each from its own session (unseeded in the engine's
/// sense: the batch may choose its windows), [`GROUP`] sessions stepped together.
#[allow(clippy::too_many_arguments)]
fn sample(
    model: &Model,
    cfg: &TextConfig,
    prompt: &[u32],
    sampler: &SamplerConfig,
    pruning: &Pruning,
    favoured: &[u32],
    n: usize,
    seed: u64,
) -> Result<(Vec<usize>, SpecStats)> {
    let v = cfg.vocab_size;
    let mut drafters = Vec::with_capacity(GROUP);
    for _ in 0..GROUP {
        drafters.push(scheduled_drafter(random_dspark(cfg, 3, 1, 11)?, favoured.to_vec()));
    }
    let mut schedule = BatchSchedule::new(BatchCost::from_table(&SCHEDULE_COST));
    let mut samples = Vec::with_capacity(n);
    let mut totals = SpecStats::default();
    while samples.len() < n {
        let g = GROUP.min(n - samples.len());
        let mut sessions = Vec::with_capacity(g);
        for (j, d) in drafters.iter_mut().take(g).enumerate() {
            let req = Request {
                prompt: prompt.to_vec(),
                generate: GenerateConfig {
                    max_tokens: 3,
                    sampler: sampler.clone(),
                    seed: seed + (samples.len() + j) as u64,
                    prefill_step: 2048,
                    stop_tokens: vec![],
                },
                stop: vec![],
                gamma: Some(3),
                pruning: pruning.clone(),
                kept_tokens: vec![],
                seeded: false,
                adaptive: false,
            };
            sessions.push(Some(Session::start(model, Some(d as &mut dyn Drafter), &req, None, None)?));
        }
        let mut outputs: Vec<Vec<u32>> = vec![Vec::new(); g];
        while sessions.iter().any(Option::is_some) {
            let live: Vec<usize> = (0..g).filter(|&j| sessions[j].is_some()).collect();
            let outs = {
                let mut members: Vec<Member<'_, '_, '_>> = sessions
                    .iter_mut()
                    .zip(drafters.iter_mut())
                    .filter_map(|(s, d)| {
                        s.as_mut().map(|s| Member { session: s, drafter: Some(d as &mut dyn Drafter) })
                    })
                    .collect();
                step(model, &mut members, &mut schedule)
            };
            for (&j, out) in live.iter().zip(outs) {
                let out = out?;
                outputs[j].extend(out.tokens);
                if out.finished.is_some() {
                    if let Some(s) = sessions[j].take() {
                        if let Some(stats) = s.finish().speculation {
                            totals.absorb(&stats);
                        }
                    }
                }
            }
        }
        for out in outputs {
            if out.len() < 2 {
                bail!("a batched speculative sample emitted {} tokens, expected 3", out.len());
            }
            samples.push(out[0] as usize * v + out[1] as usize);
        }
    }
    Ok((samples, totals))
}
