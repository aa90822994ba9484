//! The batched step: sessions stepped together decode what each decodes alone (greedy, and
//! seeded sampling), whatever the batch schedule does to their windows.

use engine::batch::{step, BatchSchedule, Member};
use engine::testing::{drafter_dir, target_dir};
use engine::{FinishReason, Request, Session};
use gemma4::generate::GenerateConfig;
use gemma4::sampling::SamplerConfig;
use gemma4::Model;
use spec_decode::schedule::batch::BatchCost;
use spec_decode::sts::Sts;
use spec_decode::{Drafter, Pruning, SpecStats, ThroughputPlan};

/// Cheap up to 4 rows, then 9 decode steps a row: more than 4 sessions leave no room for drafts.
fn cliff() -> BatchCost {
    BatchCost::new(vec![(1, 1.0), (4, 1.1), (5, 10.0)]).unwrap()
}

fn request(i: u32, temperature: f64, pruning: Pruning, seeded: bool) -> Request {
    Request {
        prompt: (0..4 + i).map(|j| 4 + (i * 41 + j * 13) % 500).collect(),
        generate: GenerateConfig {
            max_tokens: 24,
            sampler: SamplerConfig { temperature, ..Default::default() },
            seed: 100 + u64::from(i),
            prefill_step: 2048,
            stop_tokens: vec![1],
        },
        stop: vec![],
        gamma: None,
        pruning,
        kept_tokens: vec![],
        seeded,
        adaptive: false,
    }
}

fn drafter(m: &Model) -> Box<dyn Drafter> {
    spec_decode::load_drafter(drafter_dir(), m.config()).unwrap()
}

struct Done {
    tokens: Vec<u32>,
    finish: FinishReason,
    stats: Option<SpecStats>,
}

/// Every request decoded alone, then all of them stepped together under `schedule`.
fn alone_and_batched(m: &Model, reqs: &[(Request, bool)], cost: Option<BatchCost>) -> (Vec<Done>, Vec<Done>) {
    // As the engine holds them: forks of one loaded drafter.
    let first = drafter(m);
    let mut drafters: Vec<Option<Box<dyn Drafter>>> =
        reqs.iter().map(|(_, spec)| spec.then(|| first.fork().expect("a DSpark drafter forks"))).collect();
    let alone: Vec<Done> = reqs
        .iter()
        .zip(&mut drafters)
        .map(|((r, _), d)| {
            // Alone and drafting every step: a fresh schedule each step (a session's own schedule
            // would stop drafting where drafting has not paid, which is timing, not the batch).
            let mut s = Session::start(m, d.as_deref_mut(), r, None, None).unwrap();
            loop {
                let out = step(
                    m,
                    &mut [Member { session: &mut s, drafter: d.as_deref_mut() }],
                    &mut BatchSchedule::default(),
                );
                if out.into_iter().next().unwrap().unwrap().finished.is_some() {
                    break;
                }
            }
            let o = s.finish();
            Done { tokens: o.tokens, finish: o.finish, stats: o.speculation }
        })
        .collect();
    let mut sessions: Vec<Option<Session<'_, '_>>> = reqs
        .iter()
        .zip(&mut drafters)
        .map(|((r, _), d)| Some(Session::start(m, d.as_deref_mut(), r, None, None).unwrap()))
        .collect();
    let mut done: Vec<Option<Done>> = reqs.iter().map(|_| None).collect();
    let mut schedule = BatchSchedule::new(cost);
    for _ in 0..200 {
        let live: Vec<usize> = (0..reqs.len()).filter(|&i| sessions[i].is_some()).collect();
        if live.is_empty() {
            break;
        }
        let outs = {
            let mut members: Vec<Member<'_, '_, '_>> = sessions
                .iter_mut()
                .zip(drafters.iter_mut())
                .filter_map(|(s, d)| s.as_mut().map(|s| Member { session: s, drafter: d.as_deref_mut() }))
                .collect();
            step(m, &mut members, &mut schedule)
        };
        for (&i, out) in live.iter().zip(outs) {
            if out.unwrap().finished.is_some() {
                let o = sessions[i].take().unwrap().finish();
                done[i] = Some(Done { tokens: o.tokens, finish: o.finish, stats: o.speculation });
            }
        }
    }
    (alone, done.into_iter().map(|d| d.expect("every session ends")).collect())
}

#[test]
fn batched_sessions_decode_what_they_decode_alone() {
    // As stored (bf16: MLX's kernels) and in f32 (the row kernels, where the batch draws its
    // plain greedy tokens in one pass and writes every cache in one node per layer).
    batched_sessions_decode_alone(&Model::load(target_dir()).unwrap());
    let (f32m, _) = Model::load_as(target_dir(), gemma4::ComputeDtype::F32, mlx_core::Device::Cpu).unwrap();
    batched_sessions_decode_alone(&f32m);
}

fn batched_sessions_decode_alone(m: &Model) {
    let plan = |d: &dyn Drafter| {
        Pruning::Throughput(ThroughputPlan::new(Sts::identity(d.gamma()), vec![1.0, 1.02, 1.04, 1.06, 1.08]))
    };
    let d = drafter(m);
    let reqs = vec![
        (request(0, 0.0, plan(d.as_ref()), false), true),
        (request(1, 0.0, Pruning::Off, false), true),
        (request(2, 0.9, plan(d.as_ref()), true), true),
        (request(3, 0.9, Pruning::Off, true), true),
        (request(4, 0.0, Pruning::Off, false), false),
        (request(5, 0.9, Pruning::Off, true), false),
        (request(6, 0.0, plan(d.as_ref()), false), true),
        // Two plain greedy requests: the batch draws their tokens in one pass over all rows.
        (request(7, 0.0, Pruning::Off, false), false),
    ];
    let (alone, batched) = alone_and_batched(m, &reqs, Some(cliff()));
    assert_ne!(alone[4].tokens, alone[7].tokens, "the two plain greedy requests must differ to tell their rows apart");
    for (i, (a, b)) in alone.iter().zip(&batched).enumerate() {
        assert_eq!(a.tokens, b.tokens, "request {i}: batched output differs from the request alone");
        assert_eq!(a.finish, b.finish, "request {i}");
        assert!(!a.tokens.is_empty(), "request {i} emitted nothing");
    }
    // The batch schedule did choose: with 8 anchors past the cliff, the greedy throughput
    // requests (0 and 6) verified no drafts, while alone they drafted.
    for i in [0, 6] {
        let (a, b) = (alone[i].stats.as_ref().unwrap(), batched[i].stats.as_ref().unwrap());
        assert!(a.rounds > 0, "request {i} alone drafted no round");
        assert_eq!(b.rounds, 0, "request {i} batched should take plain steps only, took {} rounds", b.rounds);
        assert!(b.plain_steps > 0);
    }
    // The seeded sampled request keeps its own windows under the schedule.
    assert_eq!(alone[2].stats.as_ref().unwrap().rounds, batched[2].stats.as_ref().unwrap().rounds);
}

#[test]
fn an_unseeded_sampled_request_follows_the_batch_schedule() {
    let m = Model::load(target_dir()).unwrap();
    let d = drafter(&m);
    let plan = Pruning::Throughput(ThroughputPlan::new(Sts::identity(d.gamma()), vec![1.0, 1.02, 1.04, 1.06, 1.08]));
    let reqs: Vec<(Request, bool)> = (0..6).map(|i| (request(i, 0.9, plan.clone(), false), true)).collect();
    let (_, batched) = alone_and_batched(&m, &reqs, Some(cliff()));
    for (i, b) in batched.iter().enumerate() {
        let s = b.stats.as_ref().unwrap();
        assert_eq!(s.rounds, 0, "request {i}: 6 anchors past the cliff leave no drafts");
        assert!(b.finish == FinishReason::Length || b.finish == FinishReason::Stop);
    }
}

#[test]
fn a_prompt_prefilled_between_steps_decodes_as_one_prefilled_at_once() {
    use engine::starting::Starting;
    let m = Model::load(target_dir()).unwrap();
    let first = drafter(&m);
    // A 45-token prompt on a grid of 8: six chunks, run one per step of a running session.
    let mut long = request(9, 0.0, Pruning::Off, true);
    long.prompt = (0..45u32).map(|j| 4 + (j * 29) % 500).collect();
    long.generate.prefill_step = 8;
    let running = request(1, 0.0, Pruning::Off, true);
    let alone = |r: &Request| {
        let mut d = first.fork().unwrap();
        let s = Session::start(&m, Some(d.as_mut()), r, None, None).unwrap();
        s.run(Some(d.as_mut()), |_| {}).unwrap().tokens
    };
    let (want_long, want_running) = (alone(&long), alone(&running));

    let (mut d_run, mut d_long) = (first.fork().unwrap(), first.fork().unwrap());
    let mut run = Session::start(&m, Some(d_run.as_mut()), &running, None, None).unwrap();
    let mut got_running = Vec::new();
    let mut starting = Starting::new(&m, d_long.taps(), &long, None, None).unwrap();
    let mut chunks = 0;
    while !starting.advance(&m).unwrap() {
        chunks += 1;
        let out = run.step(Some(d_run.as_mut())).unwrap();
        got_running.extend(out.tokens);
    }
    assert_eq!(chunks, 5, "44 head tokens on a grid of 8: five chunks before the last");
    let mut late = starting.finish(&m, Some(d_long.as_mut()), None).unwrap();
    let mut got_long = Vec::new();
    loop {
        let mut members = [
            Member { session: &mut run, drafter: Some(d_run.as_mut()) },
            Member { session: &mut late, drafter: Some(d_long.as_mut()) },
        ];
        let outs = step(&m, &mut members, &mut BatchSchedule::default());
        let mut finished = true;
        for (k, o) in outs.into_iter().enumerate() {
            let o = o.unwrap();
            finished &= o.finished.is_some();
            if k == 0 {
                got_running.extend(o.tokens)
            } else {
                got_long.extend(o.tokens)
            }
        }
        if finished {
            break;
        }
    }
    assert_eq!(got_long, want_long, "the prompt prefilled chunk by chunk decodes as one prefilled at once");
    assert_eq!(got_running, want_running);
}
