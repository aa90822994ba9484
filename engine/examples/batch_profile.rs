//! Steps N plain sessions of the embedded default model together (engine::batch::step) and
//! prints the time per step and per token: `cargo run --release -p dspark-engine --example
//! batch_profile -- [N] [TOKENS]`.

use std::time::Instant;

use engine::batch::{step, BatchSchedule, Member};
use engine::{Request, Session};
use gemma4::generate::GenerateConfig;
use gemma4::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    let tokens: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let dir = engine::default_model::ensure(false)?;
    let model = Model::load_as(&dir, gemma4::ComputeDtype::Auto, mlx_core::Device::Cpu)?.0;
    let reqs: Vec<Request> = (0..n as u32)
        .map(|i| Request {
            prompt: (0..8 + i).map(|j| 4 + (i * 41 + j * 13) % 4000).collect(),
            generate: GenerateConfig { max_tokens: tokens, seed: u64::from(i), ..Default::default() },
            stop: vec![],
            gamma: None,
            pruning: Default::default(),
            kept_tokens: vec![],
            seeded: false,
            adaptive: false,
        })
        .collect();
    let mut sessions: Vec<Session<'_, '_>> =
        reqs.iter().map(|r| Session::start(&model, None, r, None, None)).collect::<Result<_, _>>()?;
    let mut schedule = BatchSchedule::default();
    let (mut steps, mut emitted) = (0usize, 0usize);
    let t0 = Instant::now();
    loop {
        let mut members: Vec<Member<'_, '_, '_>> = sessions
            .iter_mut()
            .filter(|s| s.finished().is_none())
            .map(|s| Member { session: s, drafter: None })
            .collect();
        if members.is_empty() {
            break;
        }
        for out in step(&model, &mut members, &mut schedule) {
            emitted += out?.tokens.len();
        }
        steps += 1;
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "{n} sessions: {steps} steps, {emitted} tokens in {ms:.1} ms: {:.2} ms a step, {:.0} tok/s",
        ms / steps as f64,
        emitted as f64 / ms * 1e3
    );
    Ok(())
}
