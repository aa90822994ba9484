//! Live τ next to analytic τ on the same held-out prompts. Analytic τ (what training reports)
//! is the expected accepted length under speculative sampling at temperature 1, computed from
//! the drafter's and the target's laws on the target's own greedy continuations; live τ is what
//! speculative decoding actually achieves, greedy and sampled. Reporting both shows whether the
//! training metric predicts the speedup users get.

use gemma4::generate::{generate, ids_array, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::Model;
use spec_decode::dspark::DSparkDrafter;
use spec_decode::{speculative_generate, Drafter, SpecConfig, SpecStats};

use crate::analytic::analytic_all;
use crate::drafter_train::EvalReport;
use crate::error::{Error, Result};
use crate::shards::{Sequence, Shard, TargetId};

/// Live and analytic acceptance of a drafter on some prompts.
#[derive(Clone, Debug)]
pub struct LiveReport {
    /// Prompts evaluated.
    pub prompts: usize,
    /// Greedy speculative decoding (argmax match).
    pub greedy: SpecStats,
    /// Speculative sampling at temperature 1.
    pub sampled: SpecStats,
    /// Teacher-forced analytic acceptance on the prompts' target continuations.
    pub analytic: EvalReport,
}

/// Settings of [`eval_live`].
#[derive(Clone, Debug)]
pub struct LiveOptions {
    /// Most tokens generated per prompt.
    pub max_new: usize,
    /// Tokens that end a generation.
    pub stop_tokens: Vec<u32>,
    /// Seed of the sampled runs (prompt i uses `seed + i`).
    pub seed: u64,
    /// Context rows of the analytic forward (as in training).
    pub max_ctx: usize,
}

/// Runs the drafter live (greedy and sampled) and analytically on every prompt.
pub fn eval_live(
    target: &Model,
    drafter: &mut DSparkDrafter,
    prompts: &[Vec<u32>],
    o: &LiveOptions,
) -> Result<LiveReport> {
    let taps = drafter.config().tap_layers.clone();
    let tapset = drafter.taps();
    let (mut greedy, mut sampled) = (SpecStats::default(), SpecStats::default());
    let mut seqs = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let gen = GenerateConfig { max_tokens: o.max_new, stop_tokens: o.stop_tokens.clone(), ..Default::default() };
        let plain = generate(target, p, &gen, |_| {})?;
        let ids = [p.clone(), plain.tokens].concat();
        let rows = target
            .forward_tapped(&ids_array(&ids)?, None, &tapset)?
            .taps
            .ok_or_else(|| Error::Mismatch { what: "taps", detail: "the drafter reads no taps".into() })?;
        seqs.push(Sequence { ids, resp_start: p.len(), rows: rows.squeeze(0)? });
        let g = speculative_generate(
            target,
            drafter,
            p,
            &SpecConfig { generate: gen.clone(), ..Default::default() },
            |_| {},
        )?;
        greedy.absorb(&g.stats);
        let sampler = SamplerConfig { temperature: 1.0, ..Default::default() };
        let sc =
            SpecConfig { generate: GenerateConfig { sampler, seed: o.seed + i as u64, ..gen }, ..Default::default() };
        sampled.absorb(&speculative_generate(target, drafter, p, &sc, |_| {})?.stats);
    }
    let shard = Shard::from_sequences(&TargetId::of(target.config()), &taps, &seqs)?;
    let analytic = analytic_all(target, drafter, &shard, o.max_ctx, 16)?;
    Ok(LiveReport { prompts: prompts.len(), greedy, sampled, analytic })
}
