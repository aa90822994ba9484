//! The DSpark training forward and loss: the batched teacher-forced forward computes what the
//! inference drafter computes, padding is invisible, and the loss's gradient with respect to
//! every kind of parameter matches finite differences.

use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::Model;
use mlx_core::random::KeyChain;
use mlx_core::{value_and_grad, Array, Dtype};
use spec_decode::dspark::train::{dspark_loss, forward_train, LossWeights, TrainBatch};
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::{DraftRequest, DraftSampling, Drafter};

/// An f32 copy of tiny config A (so the comparison is not at bf16 resolution).
fn target() -> Model {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = gemma4::testing::scratch("dspark-train-target");
        write_random_checkpoint(&dir, &tiny_config_a(), 11, Dtype::F32, 1, true).unwrap()
    });
    Model::load(dir).unwrap()
}

fn drafter(m: &Model) -> DSparkDrafter {
    sized_drafter(m, 32)
}

fn sized_drafter(m: &Model, d_draft: usize) -> DSparkDrafter {
    DSparkDrafter::init(small_config(d_draft), m.config(), "tiny", 5, true).unwrap()
}

/// A drafter whose heads read the draft law and with a greedy head (random heads).
fn law_drafter(m: &Model) -> DSparkDrafter {
    let cfg = DSparkConfig { conf_law: true, greedy_head: true, ..small_config(32) };
    DSparkDrafter::init(cfg, m.config(), "tiny", 5, true).unwrap()
}

fn small_config(d_draft: usize) -> DSparkConfig {
    DSparkConfig {
        gamma: 4,
        d_draft,
        n_layers: 2,
        n_heads: 4,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: vec![1, 6],
        seq_head: None,
        sts: None,
        ctx_window: None,
        conf_law: false,
        greedy_head: false,
    }
}

fn max_rel(a: &Array, b: &Array) -> f32 {
    let (a, b) = (a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap());
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

/// Tapped rows of `ids` // [1, L, m·H]
fn rows(m: &Model, d: &DSparkDrafter, ids: &[u32]) -> Array {
    m.forward_tapped(&gemma4::generate::ids_array(ids).unwrap(), None, &d.taps()).unwrap().taps.unwrap()
}

#[test]
fn training_forward_is_the_inference_forward() {
    let m = &target();
    let mut d = drafter(m);
    let ids: Vec<u32> = (0..9).map(|i| 5 + i * 37 % 400).collect();
    let (anchor, ctx_ids) = (ids[8], &ids[..8]);
    let ctx = rows(m, &d, ctx_ids);
    d.reset(Some(&ctx), 8).unwrap();
    let a = Array::from_slice(&[anchor], &[1]).unwrap();
    let cache = m.new_cache();
    let req = DraftRequest {
        anchor: &a,
        position: 8,
        max_drafts: 4,
        sampling: DraftSampling::Greedy,
        target: m,
        target_cache: &cache,
    };
    let p = d.propose(req).unwrap();
    let params = d.trainable_params().unwrap();
    let dims = d.dims().clone();
    // Teacher-forcing with the drafter's own picks gives the Markov walk inference took.
    let block = p.tokens.reshape(&[1, 4]).unwrap();
    let hidden = Array::zeros(&[1, 4, 128], Dtype::F32).unwrap();
    let batch = |ctx_rows: Array, mask: Vec<bool>| TrainBatch {
        ctx_mask: Array::from_slice(&mask, &[1, mask.len() as i32]).unwrap(),
        ctx_rows,
        anchors: a.clone(),
        block: block.clone(),
        target_hidden: hidden.clone(),
    };
    let f = forward_train(d.config(), &dims, &params, m, &batch(ctx.clone(), vec![true; 8])).unwrap();
    let logits = p.logits.as_ref().unwrap();
    assert!(max_rel(&f.logits.squeeze(0).unwrap(), logits) < 1e-4, "logits differ");
    assert!(max_rel(&f.confidence.squeeze(0).unwrap(), p.confidence.as_ref().unwrap()) < 1e-4, "confidence differs");
    // Left padding with garbage rows, masked out, changes nothing.
    let junk =
        mlx_core::random::normal(&[1, 3, 256], Dtype::F32, 0.0, 5.0, &mlx_core::random::key(1).unwrap()).unwrap();
    let padded = mlx_core::concatenate(&[&junk, &ctx], 1).unwrap();
    let mask = [vec![false; 3], vec![true; 8]].concat();
    let fp = forward_train(d.config(), &dims, &params, m, &batch(padded, mask)).unwrap();
    assert!(max_rel(&fp.logits, &f.logits) < 1e-5, "padding leaked into the forward");
}

/// Proposes a block after 8 context tokens and runs the training forward teacher-forced with
/// the drafter's own picks; returns (proposal, forward).
fn propose_and_replay(
    m: &Model,
    d: &mut DSparkDrafter,
    sampling: DraftSampling<'_>,
) -> (spec_decode::Proposal, spec_decode::dspark::train::TrainForward) {
    let ids: Vec<u32> = (0..9).map(|i| 5 + i * 37 % 400).collect();
    let ctx = rows(m, d, &ids[..8]);
    d.reset(Some(&ctx), 8).unwrap();
    let a = Array::from_slice(&[ids[8]], &[1]).unwrap();
    let cache = m.new_cache();
    let req = DraftRequest { anchor: &a, position: 8, max_drafts: 4, sampling, target: m, target_cache: &cache };
    let p = d.propose(req).unwrap();
    let batch = TrainBatch {
        ctx_mask: Array::full(&[1, 8], 1.0, Dtype::Bool).unwrap(),
        ctx_rows: ctx,
        anchors: a,
        block: p.tokens.reshape(&[1, 4]).unwrap(),
        target_hidden: Array::zeros(&[1, 4, 128], Dtype::F32).unwrap(),
    };
    let f = forward_train(d.config(), d.dims(), &d.trainable_params().unwrap(), m, &batch).unwrap();
    (p, f)
}

#[test]
fn law_reading_and_greedy_heads_are_the_trained_heads() {
    let m = &target();
    let mut d = law_drafter(m);
    // Greedy decoding reads the greedy head.
    let (p, f) = propose_and_replay(m, &mut d, DraftSampling::Greedy);
    assert!(max_rel(&f.logits.squeeze(0).unwrap(), p.logits.as_ref().unwrap()) < 1e-4, "logits differ");
    let greedy = f.greedy_confidence.as_ref().expect("the greedy head's confidences").squeeze(0).unwrap();
    let got = p.confidence.as_ref().unwrap();
    assert!(max_rel(&greedy, got) < 1e-4, "greedy confidence differs from the greedy head");
    assert!(max_rel(&f.confidence.squeeze(0).unwrap(), got) > 1e-2, "the two heads should differ here");
    // Sampled decoding reads the sampled head.
    let cfg = gemma4::sampling::SamplerConfig { temperature: 1.0, ..Default::default() };
    let mut keys = KeyChain::new(4).unwrap();
    let (p, f) = propose_and_replay(m, &mut d, DraftSampling::Sample { cfg: &cfg, keys: &mut keys });
    assert!(max_rel(&f.confidence.squeeze(0).unwrap(), p.confidence.as_ref().unwrap()) < 1e-4, "sampled head");
    // The law features: top-1 log-probability and entropy, checked on a hand-computed law.
    let l = Array::from_slice(&[0f32, 1f32.ln(), 2f32.ln()], &[1, 3]).unwrap(); // p = [1/4, 1/4, 1/2]
    let v = spec_decode::dspark::confidence::law_features(&l).unwrap().to_f32_vec().unwrap();
    let h = -(2.0 * 0.25 * 0.25f32.ln() + 0.5 * 0.5f32.ln());
    assert!((v[0] - 0.5f32.ln()).abs() < 1e-6 && (v[1] - h).abs() < 1e-6, "{v:?}");
}

/// Three anchors with 5 random context rows each (which are real: `ctx_mask` // `[3, 5]`),
/// fixed blocks and random target hiddens.
fn three_anchor_batch(ctx_mask: Array) -> TrainBatch {
    let mut keys = KeyChain::new(3).unwrap();
    let a = 3;
    TrainBatch {
        ctx_rows: mlx_core::random::normal(&[a, 5, 256], Dtype::F32, 0.0, 1.0, &keys.next_key().unwrap()).unwrap(),
        ctx_mask,
        anchors: Array::from_slice(&[7u32, 100, 311], &[a]).unwrap(),
        block: Array::from_slice(&[1u32, 2, 3, 4, 50, 60, 70, 80, 9, 99, 199, 299], &[a, 4]).unwrap(),
        target_hidden: mlx_core::random::normal(&[a, 4, 128], Dtype::F32, 0.0, 1.0, &keys.next_key().unwrap()).unwrap(),
    }
}

#[test]
fn the_greedy_head_learns_without_shaping_the_drafter() {
    let m = &target();
    let d = law_drafter(m);
    let (cfg, dims) = (d.config().clone(), d.dims().clone());
    let batch = three_anchor_batch(Array::full(&[3, 5], 1.0, Dtype::Bool).unwrap());
    let only_greedy = LossWeights { ce: 0.0, tv: 0.0, bce: 0.0, bce_greedy: 1.0 };
    let params = d.trainable_params().unwrap();
    let argnums: Vec<usize> = (0..params.len()).collect();
    let f = |xs: &[Array]| -> spec_decode::Result<Vec<Array>> {
        let t = dspark_loss(&forward_train(&cfg, &dims, xs, m, &batch)?, m, &batch, &only_greedy)?;
        Ok(vec![t.total, t.bce_greedy, t.greedy_tau])
    };
    let (values, grads) = value_and_grad(f, &params, &argnums).unwrap();
    let v: Vec<f32> = values.iter().map(|x| x.to_f32_vec().unwrap()[0]).collect();
    assert!(v[0] > 0.0 && v[0] == v[1], "the loss is the greedy BCE alone: {v:?}");
    assert!((1.0..=5.0).contains(&v[2]), "greedy τ {} outside [1, γ + 1]", v[2]);
    for (name, g) in cfg.param_names().iter().zip(&grads) {
        let n = g.abs().unwrap().sum_all().unwrap().to_f32_vec().unwrap()[0];
        if name.starts_with("conf_greedy.") {
            assert!(n > 0.0, "{name}: the greedy head gets no gradient");
        } else {
            assert_eq!(n, 0.0, "{name}: the greedy BCE reached a parameter it must not shape");
        }
    }
    // The greedy τ counts leading argmax agreements, checked against the same count on the host.
    let fwd = forward_train(&cfg, &dims, &params, m, &batch).unwrap();
    let t = dspark_loss(&fwd, m, &batch, &LossWeights::default()).unwrap();
    let draft = fwd.logits.argmax(-1, false).unwrap().to_vec::<u32>().unwrap();
    let want = m.logits_from_hidden(&batch.target_hidden).unwrap().argmax(-1, false).unwrap().to_vec::<u32>().unwrap();
    let lead = |r: usize| (0..4).take_while(|&k| draft[r * 4 + k] == want[r * 4 + k]).count() as f32;
    let expect = (0..3).map(|r| 1.0 + lead(r)).sum::<f32>() / 3.0;
    assert!((t.greedy_tau.to_f32_vec().unwrap()[0] - expect).abs() < 1e-6, "greedy τ vs {expect}");
}

#[test]
fn loss_gradient_matches_finite_differences() {
    let m = &target();
    let d = drafter(m);
    let (cfg, dims) = (d.config().clone(), d.dims().clone());
    let batch = three_anchor_batch(
        Array::from_slice(
            &[false, true, true, true, true, false, false, true, true, true, true, true, true, true, true],
            &[3, 5],
        )
        .unwrap(),
    );
    let params = d.trainable_params().unwrap();
    let names = cfg.param_names();
    // The BCE target c* is under stop-gradient, so finite differences (which do see c* move)
    // agree with the gradient only where c* is held still: without the BCE term for every
    // parameter, and with it for the confidence head, on which c* does not depend.
    let no_bce = LossWeights { bce: 0.0, ..LossWeights::default() };
    let all = ["bb.0.q", "bb.1.down", "W_c", "ctx_norm", "tok_proj", "mask_emb", "out_proj", "markov.w1", "markov.w2"];
    for (weights, probes) in [(no_bce, &all[..]), (LossWeights::default(), &["conf.w", "conf.b"][..])] {
        let loss = |xs: &[Array]| -> spec_decode::Result<Array> {
            let f = forward_train(&cfg, &dims, xs, m, &batch)?;
            Ok(dspark_loss(&f, m, &batch, &weights)?.total)
        };
        let argnums: Vec<usize> = (0..params.len()).collect();
        let (values, grads) =
            value_and_grad(|xs: &[Array]| Ok::<_, spec_decode::Error>(vec![loss(xs)?]), &params, &argnums).unwrap();
        let l0 = values[0].to_f32_vec().unwrap()[0];
        assert!(l0.is_finite() && l0 > 0.0, "loss {l0}");
        let norm = |x: &Array| f64::from(x.square().unwrap().sum_all().unwrap().to_f32_vec().unwrap()[0]).sqrt();
        for probe in probes {
            let i = names.iter().position(|n| n == probe).unwrap();
            let g = &grads[i];
            assert!(norm(g) > 0.0, "{probe}: zero gradient");
            // Along the gradient itself, the directional derivative is ‖g‖.
            let v = g.div_scalar(norm(g)).unwrap();
            let at = |h: f64| {
                let mut xs = params.clone();
                xs[i] = params[i].add(&v.mul_scalar(h).unwrap()).unwrap();
                f64::from(loss(&xs).unwrap().to_f32_vec().unwrap()[0])
            };
            let central = |h: f64| (at(h) - at(-h)) / (2.0 * h);
            let analytic = norm(g);
            // A small gradient moves the f32 loss by little more than its rounding over a step
            // of 1e-2 (how much rounding depends on the CPU's BLAS kernels): take longer steps.
            let h = if analytic < 1e-2 { 5e-2 } else { 5e-3 };
            let numeric = (4.0 * central(h) - central(2.0 * h)) / 3.0;
            // f32 losses of order 1 leave ~1e-5 of rounding in a difference quotient, and the L1
            // term has kinks a step may cross: errors are relative to the gradient (floored at
            // 1e-2) and must stay under 1%.
            let rel = (analytic - numeric).abs() / analytic.max(1e-2);
            assert!(rel < 1e-2, "{probe}: analytic {analytic} vs numeric {numeric} (rel {rel:.2e})");
        }
    }
}

#[test]
fn one_batch_is_overfit() {
    use train::{AdamW, AdamWConfig};
    let m = &target();
    let d = sized_drafter(m, 64);
    let (cfg, dims) = (d.config().clone(), d.dims().clone());
    let mut keys = KeyChain::new(9).unwrap();
    let a = 2;
    // Peaked target laws: a hidden state along a token's own (tied) embedding row makes that
    // token's logit stand out, so the loss can approach 0 once the drafter matches p^t.
    let block = Array::from_slice(&[17u32, 99, 256, 4, 400, 12, 77, 300], &[a, 4]).unwrap();
    let rows = m.embed_raw(&block).unwrap().astype(Dtype::F32).unwrap(); // [A, γ, H]
    let sq = rows.square().unwrap().sum(&[-1], true).unwrap();
    let target_hidden = rows.divide(&sq).unwrap().mul_scalar(25.0).unwrap();
    let batch = TrainBatch {
        ctx_rows: mlx_core::random::normal(&[a, 6, 256], Dtype::F32, 0.0, 1.0, &keys.next_key().unwrap()).unwrap(),
        ctx_mask: Array::full(&[a, 6], 1.0, Dtype::Bool).unwrap(),
        anchors: Array::from_slice(&[3u32, 300], &[a]).unwrap(),
        block,
        target_hidden,
    };
    let mut params = d.trainable_params().unwrap();
    let argnums: Vec<usize> = (0..params.len()).collect();
    let mut opt = AdamW::new(AdamWConfig { weight_decay: 0.0, ..Default::default() }, &params).unwrap();
    let mut losses = Vec::new();
    let mut tau = 0.0;
    for _ in 0..80 {
        let f = |xs: &[Array]| -> spec_decode::Result<Vec<Array>> {
            let t = dspark_loss(&forward_train(&cfg, &dims, xs, m, &batch)?, m, &batch, &LossWeights::default())?;
            Ok(vec![t.total, t.tau])
        };
        let (values, grads) = value_and_grad(f, &params, &argnums).unwrap();
        let (grads, _) = train::clip_global_norm(&grads, 1.0).unwrap();
        params = opt.step(&params, &grads, 1e-2).unwrap();
        let mut all: Vec<&Array> = params.iter().chain(&values).collect();
        all.extend(opt.state_arrays());
        mlx_core::eval(&all).unwrap();
        losses.push(values[0].to_f32_vec().unwrap()[0]);
        tau = values[1].to_f32_vec().unwrap()[0];
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.1 * first, "loss {first} -> {last}: did not fall by 90%");
    assert!(tau > 4.9, "analytic τ {tau} after overfitting a γ = 4 block (max 5)");
}
