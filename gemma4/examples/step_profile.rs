//! Where a plain decode step's time goes: the graph nodes one step builds (by primitive), the
//! host time spent building its graph, and the time evaluating it (kernels plus MLX's per-node
//! work), as ms per step over a run of greedy steps (`cargo xtask bench --steps` runs the same
//! profile over the default model and the mid-size checkpoint's dtypes).
//!
//! ```sh
//! cargo run --release -p gemma4 --example step_profile -- MODEL_DIR [STEPS]
//! ```

use std::path::PathBuf;

use gemma4::compute::ComputeDtype;
use gemma4::step_profile::profile_steps;
use gemma4::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().ok_or("usage: step_profile MODEL_DIR [STEPS]")?);
    let steps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);
    let (model, resolved) = Model::load_as(&dir, ComputeDtype::Auto, mlx_core::Device::Cpu)?;
    println!("{}", resolved.describe());
    let p = profile_steps(&model, steps)?;
    println!("{} graph nodes per step: {:?}", p.nodes, p.by_primitive);
    println!("{} steps: build {:.3} ms/step, eval {:.3} ms/step", p.steps, p.build_ms, p.eval_ms);
    Ok(())
}
