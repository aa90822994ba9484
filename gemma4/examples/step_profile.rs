//! Where a plain decode step's time goes: the graph nodes one step builds (by primitive), the
//! host time spent building its graph, and the time evaluating it (kernels plus MLX's per-node
//! work), as ms per step over a run of greedy steps.
//!
//! ```sh
//! cargo run --release -p gemma4 --example step_profile -- MODEL_DIR [STEPS]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use gemma4::compute::ComputeDtype;
use gemma4::generate::{ids_array, prefill, step_logits};
use gemma4::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: step_profile MODEL_DIR [STEPS]")?);
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let (model, resolved) = Model::load_as(&dir, ComputeDtype::Auto, mlx_core::Device::Cpu)?;
    println!("{}", resolved.describe());
    let mut cache = model.new_cache();
    let prompt: Vec<u32> = (10..74).collect();
    let mut token = prefill(&model, &mut cache, &prompt, 512)?.argmax(-1, false)?;
    token.eval()?;

    // One step's graph, before it runs.
    let next = step_logits(&model, &mut cache.clone(), &ids_array(&[token.reshape(&[1])?.item::<u32>()?])?)?;
    let nodes = mlx_core::pending_nodes(&[&next.argmax(-1, false)?])?;
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for n in &nodes {
        *counts.entry(n.as_str()).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|&(name, n)| (std::cmp::Reverse(n), name));
    println!("{} graph nodes per step: {counts:?}", nodes.len());

    let (mut build, mut run) = (0.0, 0.0);
    for _ in 0..steps {
        let t0 = Instant::now();
        let id = ids_array(&[token.reshape(&[1])?.item::<u32>()?])?;
        let next = step_logits(&model, &mut cache, &id)?.argmax(-1, false)?;
        let t1 = Instant::now();
        next.eval()?;
        build += (t1 - t0).as_secs_f64();
        run += t1.elapsed().as_secs_f64();
        token = next;
    }
    let per = |s: f64| s * 1e3 / steps.max(1) as f64;
    println!("{steps} steps: build {:.3} ms/step, eval {:.3} ms/step", per(build), per(run));
    Ok(())
}
