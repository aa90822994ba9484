//! Where a plain decode step's time goes: the graph nodes one step builds (by primitive), the
//! host time spent building its graph, and the time evaluating it (kernels plus MLX's per-node
//! work), as ms per step over a run of greedy steps. Used by the `step_profile` example and
//! `cargo xtask bench --steps`.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::error::Result;
use crate::generate::{ids_array, prefill, step_logits};
use crate::Model;

/// One run of greedy decode steps after a 64-token prompt.
#[derive(Clone, Debug)]
pub struct StepProfile {
    /// Graph nodes one step evaluates.
    pub nodes: usize,
    /// Those nodes by primitive name, most frequent first.
    pub by_primitive: Vec<(String, usize)>,
    /// Steps timed.
    pub steps: usize,
    /// Host time building a step's graph, ms per step.
    pub build_ms: f64,
    /// Time evaluating a step's graph (the one host sync included), ms per step.
    pub eval_ms: f64,
}

impl StepProfile {
    /// Build plus evaluation, ms per token.
    pub fn step_ms(&self) -> f64 {
        self.build_ms + self.eval_ms
    }
}

/// Profiles `steps` greedy decode steps of `model` (after a 64-token prompt).
pub fn profile_steps(model: &Model, steps: usize) -> Result<StepProfile> {
    let mut cache = model.new_cache();
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = (10..74).map(|t| t % vocab.max(1)).collect();
    let mut token = prefill(model, &mut cache, &prompt, 512)?.argmax(-1, false)?;
    token.eval()?;

    // One step's graph, before it runs (on a copy of the cache: it is not evaluated).
    let first = ids_array(&[token.reshape(&[1])?.item::<u32>()?])?;
    let next = step_logits(model, &mut cache.clone(), &first)?;
    let names = mlx_core::pending_nodes(&[&next.argmax(-1, false)?])?;
    let mut counts = BTreeMap::<String, usize>::new();
    for n in &names {
        *counts.entry(n.clone()).or_default() += 1;
    }
    let mut by_primitive: Vec<(String, usize)> = counts.into_iter().collect();
    by_primitive.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));

    let (mut build, mut run) = (0.0, 0.0);
    for _ in 0..steps {
        let t0 = Instant::now();
        let id = ids_array(&[token.reshape(&[1])?.item::<u32>()?])?;
        let next = step_logits(model, &mut cache, &id)?.argmax(-1, false)?;
        let t1 = Instant::now();
        next.eval()?;
        build += (t1 - t0).as_secs_f64();
        run += t1.elapsed().as_secs_f64();
        token = next;
    }
    let per = |s: f64| s * 1e3 / steps.max(1) as f64;
    Ok(StepProfile { nodes: names.len(), by_primitive, steps, build_ms: per(build), eval_ms: per(run) })
}
