use engine::batch::{step, BatchSchedule, Member};
use engine::{Request, Session};
use gemma4::generate::GenerateConfig;
use gemma4::{ComputeDtype, Model};
use std::time::Instant;

fn main() {
    let n: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(16);
    let spec = std::env::args().nth(2).is_some();
    let dir = engine::default_model::ensure(false).unwrap();
    let (m, res) = Model::load_as(&dir, ComputeDtype::Auto, mlx_core::Device::Cpu).unwrap();
    let tok = gemma4::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let ddir = engine::default_model::ensure_drafter(false).unwrap();
    let first = spec_decode::load_drafter_as(&ddir, m.config(), res.conversion.dequantize).unwrap();
    let mut drafters: Vec<Option<Box<dyn spec_decode::Drafter>>> =
        (0..n).map(|_| spec.then(|| first.fork().unwrap())).collect();
    let sched_on = std::env::var("SCHED").is_ok();
    let pruning = if spec && sched_on {
        engine::schedule::choose(engine::Schedule::Auto, None, first.as_ref(), &m, &dir, mlx_core::Device::Cpu, true)
            .unwrap()
            .0
    } else {
        Default::default()
    };
    let mut sessions: Vec<Session<'_, '_>> = (0..n)
        .map(|i| {
            let req = Request {
                prompt: tok.encode(&format!("def f{i}(x):\n    return"), false).unwrap(),
                generate: GenerateConfig { max_tokens: 4000, stop_tokens: vec![], ..Default::default() },
                stop: vec![],
                gamma: None,
                pruning: pruning.clone(),
                kept_tokens: vec![],
                seeded: false,
            };
            Session::start(&m, drafters[i].as_deref_mut(), &req, Some(&tok), None).unwrap()
        })
        .collect();
    let mut sched = if sched_on {
        let p = spec_decode::profile::load(&dir, "cpu-float32").unwrap().unwrap();
        BatchSchedule::new(spec_decode::schedule::batch::BatchCost::new(p.batch.unwrap()))
    } else {
        BatchSchedule::default()
    };
    let t = Instant::now();
    let mut toks = 0;
    let steps = 40;
    for _ in 0..steps {
        let mut members: Vec<Member<'_, '_, '_>> = sessions
            .iter_mut()
            .zip(drafters.iter_mut())
            .map(|(s, d)| Member { session: s, drafter: d.as_deref_mut() })
            .collect();
        for o in step(&m, &mut members, &mut sched) {
            toks += o.unwrap().tokens.len();
        }
    }
    let dt = t.elapsed().as_secs_f64();
    println!("{n} sessions spec={spec}: {:.2} ms/step, {:.0} tok/s", dt * 1e3 / steps as f64, toks as f64 / dt);
}
