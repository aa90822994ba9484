//! AdamW, the schedule, clipping and the training state against hand-computed values and
//! host references, and a resume that continues bit for bit.

use mlx_core::random::KeyChain;
use mlx_core::{value_and_grad, Array, Dtype, Error};
use train::{clip_global_norm, AdamW, AdamWConfig, TrainState, WarmupCosine};

fn host(a: &Array) -> Vec<f32> {
    a.to_f32_vec().unwrap()
}

/// AdamW on the host in f64: the formula, written independently of the device code.
fn reference_adamw(w: &mut [f64], m: &mut [f64], v: &mut [f64], g: &[f64], t: u64, lr: f64, c: &AdamWConfig) {
    for i in 0..w.len() {
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * g[i];
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * g[i] * g[i];
        let mh = m[i] / (1.0 - c.beta1.powi(t as i32));
        let vh = v[i] / (1.0 - c.beta2.powi(t as i32));
        w[i] = w[i] * (1.0 - lr * c.weight_decay) - lr * mh / (vh.sqrt() + c.eps);
    }
}

#[test]
fn adamw_matches_the_formula_over_several_steps() {
    let c = AdamWConfig { weight_decay: 0.1, ..Default::default() };
    let w0 = [0.5f32, -1.25, 2.0, 0.0];
    let grads = [[0.1f32, -0.2, 0.3, 0.0], [0.05, 0.4, -0.3, 1.0], [-0.2, 0.1, 0.0, 0.5]];
    let mut params = vec![Array::from_slice(&w0, &[2, 2]).unwrap()];
    let mut opt = AdamW::new(c.clone(), &params).unwrap();
    let (mut w, mut m, mut v) = (w0.map(f64::from).to_vec(), vec![0.0; 4], vec![0.0; 4]);
    for (t, g) in grads.iter().enumerate() {
        let lr = 1e-2 * (t + 1) as f64;
        params = opt.step(&params, &[Array::from_slice(g, &[2, 2]).unwrap()], lr).unwrap();
        reference_adamw(&mut w, &mut m, &mut v, &g.map(f64::from), t as u64 + 1, lr, &c);
    }
    assert_eq!(opt.step, 3);
    for (got, want) in host(&params[0]).iter().zip(&w) {
        assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
    }
}

#[test]
fn the_first_step_moves_each_weight_by_lr() {
    // Bias correction makes m̂/√v̂ = sign(g) on step 1, so every weight moves by lr.
    let c = AdamWConfig { weight_decay: 0.0, ..Default::default() };
    let p = vec![Array::from_slice(&[1.0f32, 1.0, 1.0], &[3]).unwrap()];
    let mut opt = AdamW::new(c, &p).unwrap();
    let g = Array::from_slice(&[3.0f32, -1e-3, 50.0], &[3]).unwrap();
    let out = host(&opt.step(&p, &[g], 0.01).unwrap()[0]);
    for (got, want) in out.iter().zip([0.99f32, 1.01, 0.99]) {
        assert!((got - want).abs() < 1e-5, "{out:?}");
    }
    // bf16 parameters keep their dtype; moments stay f32.
    let pb = vec![Array::from_slice(&[1.0f32], &[1]).unwrap().astype(Dtype::Bf16).unwrap()];
    let mut ob = AdamW::new(AdamWConfig::default(), &pb).unwrap();
    let nb = ob.step(&pb, &[Array::from_slice(&[1.0f32], &[1]).unwrap()], 0.1).unwrap();
    assert_eq!((nb[0].dtype(), ob.m[0].dtype()), (Dtype::Bf16, Dtype::F32));
    assert!(opt.step(&p, &[], 0.1).is_err(), "gradients must line up with parameters");
}

#[test]
fn warmup_then_cosine_to_a_tenth() {
    let s = WarmupCosine::new(1e-3, 10, 110);
    assert!((s.lr(0) - 1e-4).abs() < 1e-12, "first warmup step");
    assert!((s.lr(9) - 1e-3).abs() < 1e-12, "end of warmup is the peak");
    assert!((s.lr(10) - 1e-3).abs() < 1e-12, "cosine starts at the peak");
    assert!((s.lr(60) - 0.55e-3).abs() < 1e-12, "half way: midpoint of peak and floor");
    assert!((s.lr(110) - 1e-4).abs() < 1e-12 && (s.lr(10_000) - 1e-4).abs() < 1e-12, "floor is 10% of the peak");
    assert!((1..200).all(|t| s.lr(t) <= s.lr(t - 1) + 1e-15 || t <= 9), "monotone after warmup");
}

#[test]
fn clipping_scales_all_gradients_by_one_factor() {
    let g = vec![Array::from_slice(&[3.0f32], &[1]).unwrap(), Array::from_slice(&[0.0f32, 4.0], &[2]).unwrap()];
    let (clipped, norm) = clip_global_norm(&g, 1.0).unwrap();
    assert!((host(&norm)[0] - 5.0).abs() < 1e-6);
    assert!((host(&clipped[0])[0] - 0.6).abs() < 1e-5 && (host(&clipped[1])[1] - 0.8).abs() < 1e-5);
    let (kept, _) = clip_global_norm(&g, 10.0).unwrap();
    assert_eq!(host(&kept[1]), vec![0.0, 4.0], "under the limit nothing changes");
}

/// A small noisy regression trained for `steps` updates from `state`: loss = mean((xw − y)²)
/// on a batch drawn with the state's RNG, so resuming must restore the RNG too.
fn train(mut state: TrainState, steps: usize) -> TrainState {
    let sched = WarmupCosine::new(0.05, 3, 20);
    let mut keys = KeyChain::from_state(state.rng.clone());
    for _ in 0..steps {
        let x = mlx_core::random::normal(&[8, 4], Dtype::F32, 0.0, 1.0, &keys.next_key().unwrap()).unwrap();
        let y = x.sum(&[1], true).unwrap();
        let loss = |xs: &[Array]| -> Result<Vec<Array>, Error> {
            Ok(vec![x.matmul(&xs[0])?.subtract(&y)?.square()?.mean_all()?])
        };
        let (_, grads) = value_and_grad(loss, &state.params, &[0]).unwrap();
        let (grads, _) = clip_global_norm(&grads, 1.0).unwrap();
        let lr = sched.lr(state.opt.step);
        state.params = state.opt.step(&state.params, &grads, lr).unwrap();
        let mut all: Vec<&Array> = state.params.iter().collect();
        all.extend(state.opt.state_arrays());
        mlx_core::eval(&all).unwrap();
    }
    state.rng = keys.state().clone();
    state
}

#[test]
fn resuming_from_a_saved_state_continues_bit_for_bit() {
    let params = vec![Array::zeros(&[4, 1], Dtype::F32).unwrap()];
    let fresh = || TrainState {
        names: vec!["w".into()],
        params: params.clone(),
        opt: AdamW::new(AdamWConfig::default(), &params).unwrap(),
        rng: KeyChain::new(7).unwrap().state().clone(),
        extra: serde_json::json!({"run": "test"}),
    };
    let straight = train(fresh(), 12);
    let half = train(fresh(), 6);
    let dir = std::env::temp_dir().join(format!("train-state-{}", std::process::id()));
    half.save(&dir, true).unwrap();
    let resumed = TrainState::load(&dir).unwrap();
    assert_eq!(resumed.opt.step, 6);
    assert_eq!(resumed.extra, serde_json::json!({"run": "test"}));
    let resumed = train(resumed, 6);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(resumed.params[0].to_bytes().unwrap(), straight.params[0].to_bytes().unwrap());
    assert_eq!(resumed.opt.v[0].to_bytes().unwrap(), straight.opt.v[0].to_bytes().unwrap());
    // And training did something: w approaches ones.
    let w = host(&straight.params[0]);
    assert!(w.iter().all(|&x| x > 0.1), "{w:?}");
}

#[test]
fn a_state_with_a_missing_tensor_is_refused() {
    let params = vec![Array::zeros(&[2], Dtype::F32).unwrap()];
    let s = TrainState {
        names: vec!["w".into()],
        params: params.clone(),
        opt: AdamW::new(AdamWConfig::default(), &params).unwrap(),
        rng: KeyChain::new(1).unwrap().state().clone(),
        extra: serde_json::Value::Null,
    };
    let dir = std::env::temp_dir().join(format!("train-state-bad-{}", std::process::id()));
    s.save(&dir, true).unwrap();
    let json = dir.join("state.json");
    let text = std::fs::read_to_string(&json).unwrap().replace("\"w\"", "\"w2\"");
    std::fs::write(&json, text).unwrap();
    let e = TrainState::load(&dir).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.contains("param/w2") && e.contains("missing"), "{e}");
}
