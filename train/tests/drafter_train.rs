//! Training a DSpark drafter end to end on shards regenerated from a tiny target: validation τ
//! rises above the untrained drafter's, the best checkpoint loads, resuming continues bit for
//! bit, and data of another shape is refused.

use std::path::{Path, PathBuf};

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::generate::{generate, ids_array, GenerateConfig};
use gemma4::Model;
use mlx_core::Dtype;
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use train::drafter_train::{split_shards, train_drafter, DrafterTrainConfig};
use train::shards::{write_shard, Sequence, TargetId};

fn scratch(name: &str) -> PathBuf {
    gemma4::testing::scratch(&format!("drafter-train-{name}"))
}

fn drafter_cfg(taps: Vec<usize>) -> DSparkConfig {
    DSparkConfig {
        gamma: 3,
        d_draft: 32,
        n_layers: 1,
        n_heads: 4,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: taps,
        seq_head: None,
        sts: None,
        ctx_window: None,
        conf_law: false,
        greedy_head: false,
    }
}

/// Shards of the target's own greedy continuations of short prompts (as `dspark regen` makes).
/// Every shard holds the same prompts: a tiny random target's continuations of *other* prompts
/// are not learnable from a few sequences, and this tests the optimisation, not generalisation.
fn regen(m: &Model, dir: &Path, taps: &[usize], shards: usize) {
    let cfg = DSparkConfig { tap_layers: taps.to_vec(), ..drafter_cfg(vec![]) };
    let tapset = cfg.tap_set(m.config().num_hidden_layers);
    for s in 0..shards {
        let _ = s;
        let seqs: Vec<Sequence> = (0..4)
            .map(|i| {
                let prompt: Vec<u32> = (0..5).map(|j| 4 + (i * 37 + j * 11) as u32 % 500).collect();
                let out =
                    generate(m, &prompt, &GenerateConfig { max_tokens: 24, ..Default::default() }, |_| {}).unwrap();
                let ids = [prompt.clone(), out.tokens].concat();
                let rows = m.forward_tapped(&ids_array(&ids).unwrap(), None, &tapset).unwrap().taps.unwrap();
                Sequence { resp_start: prompt.len(), rows: rows.squeeze(0).unwrap(), ids }
            })
            .collect();
        write_shard(dir, s, &TargetId::of(m.config()), taps, &seqs).unwrap();
    }
}

/// A tiny random target whose predictions are peaked (the final norm's scale multiplied by 8),
/// as a trained model's are; with the flat laws of a raw random model there is little to learn.
fn peaked_target(root: &Path) -> Model {
    let dir = write_random_checkpoint(&root.join("target"), &tiny_config_a(), 4, Dtype::F32, 1, true).unwrap();
    let file = dir.join("model.safetensors");
    let mut t = mlx_core::load_safetensors(&file).unwrap().tensors;
    let norm = t["model.norm.weight"].mul_scalar(8.0).unwrap();
    t.insert("model.norm.weight".into(), norm);
    mlx_core::eval(&t.values().collect::<Vec<_>>()).unwrap();
    mlx_core::save_safetensors(&file, t.iter().map(|(k, v)| (k.as_str(), v)), &Default::default()).unwrap();
    Model::load(&dir).unwrap()
}

fn quick(steps: u64) -> DrafterTrainConfig {
    DrafterTrainConfig {
        steps,
        batch: 8,
        lr: 1e-2,
        warmup: 5,
        max_ctx: 16,
        eval_every: 10,
        eval_batches: 2,
        ..Default::default()
    }
}

#[test]
fn training_raises_validation_tau_and_resumes_bit_for_bit() {
    let root = scratch("e2e");
    let m = peaked_target(&root);
    let taps = vec![2, 6];
    let data = root.join("data");
    regen(&m, &data, &taps, 4);
    let init = DSparkDrafter::init(drafter_cfg(taps.clone()), m.config(), "tiny", 1, false).unwrap();
    let mut evals = Vec::new();
    let report = train_drafter(&m, &init, std::slice::from_ref(&data), &root.join("run"), &quick(300), false, |p| {
        if let Some(e) = &p.eval {
            evals.push(e.tau);
        }
    })
    .unwrap();
    assert_eq!(report.steps, 300);
    assert!(report.last_loss < report.first_loss, "loss {} -> {}", report.first_loss, report.last_loss);
    let best = report.best.clone().unwrap();
    assert!(best.tau > report.initial.tau + 0.1, "validation τ {} -> {evals:?}", report.initial.tau);
    // The best checkpoint is a loadable drafter for this target.
    let loaded = spec_decode::load_drafter(&report.best_dir, m.config()).unwrap();
    assert_eq!(loaded.gamma(), 3);

    // 40 steps straight = 20 steps, an interruption, and a resume.
    let (straight, half) = (root.join("straight"), root.join("half"));
    train_drafter(&m, &init, std::slice::from_ref(&data), &straight, &quick(40), false, |_| {}).unwrap();
    let stopped = DrafterTrainConfig { stop_after: Some(20), ..quick(40) };
    assert_eq!(
        train_drafter(&m, &init, std::slice::from_ref(&data), &half, &stopped, false, |_| {}).unwrap().steps,
        20
    );
    assert_eq!(
        train_drafter(&m, &init, std::slice::from_ref(&data), &half, &quick(40), true, |_| {}).unwrap().steps,
        40
    );
    let a = train::TrainState::load(&straight.join("state")).unwrap();
    let b = train::TrainState::load(&half.join("state")).unwrap();
    assert_eq!(a.opt.step, b.opt.step);
    for (x, y) in a.params.iter().zip(&b.params).chain(a.opt.m.iter().zip(&b.opt.m)) {
        assert_eq!(x.to_bytes().unwrap(), y.to_bytes().unwrap(), "resumed state differs");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn data_of_another_shape_is_refused() {
    let root = scratch("refuse");
    let m =
        Model::load(&write_random_checkpoint(&root.join("target"), &tiny_config_a(), 4, Dtype::F32, 1, true).unwrap())
            .unwrap();
    let data = root.join("data");
    regen(&m, &data, &[2, 6], 2);
    let drafter = |taps: Vec<usize>| DSparkDrafter::init(drafter_cfg(taps), m.config(), "tiny", 1, false).unwrap();
    let run = |d: &DSparkDrafter| {
        train_drafter(&m, d, std::slice::from_ref(&data), &root.join("run"), &quick(2), false, |_| {})
    };
    let e = run(&drafter(vec![2, 6])).unwrap_err().to_string();
    assert!(e.contains("2 shard(s)") && e.contains("at least 3"), "{e}");
    let e = run(&drafter(vec![3, 6])).unwrap_err().to_string();
    assert!(e.contains("taps [2, 6]") && e.contains("expected"), "{e}");
    let e = run(&drafter(vec![6, 2])).unwrap_err().to_string();
    assert!(e.contains("final-norm"), "{e}");
    let e =
        train_drafter(&m, &drafter(vec![2, 6]), &[root.join("nowhere")], &root.join("run"), &quick(2), false, |_| {})
            .unwrap_err()
            .to_string();
    assert!(e.contains("nowhere"), "{e}");
    // With several directories each is checked on its own: three good shards do not hide a
    // second directory of two, and a second directory of other taps is named.
    let good = root.join("good");
    regen(&m, &good, &[2, 6], 3);
    let other = root.join("other");
    regen(&m, &other, &[3, 6], 3);
    let pooled =
        |dirs: &[PathBuf]| train_drafter(&m, &drafter(vec![2, 6]), dirs, &root.join("run"), &quick(2), false, |_| {});
    let e = pooled(&[good.clone(), data.clone()]).unwrap_err().to_string();
    assert!(e.contains("2 shard(s)") && e.contains("data"), "{e}");
    let e = pooled(&[good.clone(), other.clone()]).unwrap_err().to_string();
    assert!(e.contains("other") && e.contains("taps [3, 6]"), "{e}");
    assert!(pooled(&[]).unwrap_err().to_string().contains("no data directory"));
    assert_eq!(pooled(&[good.clone(), good]).unwrap().steps, 2);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_split_never_hands_the_test_slice_to_training() {
    let shards: Vec<PathBuf> = (0..25).map(|i| PathBuf::from(format!("shard_{i:05}"))).collect();
    let s = split_shards(&shards, Path::new("d")).unwrap();
    assert_eq!((s.train.len(), s.val.len(), s.test.len()), (21, 2, 2));
    assert!(s.test.iter().all(|t| !s.train.contains(t) && !s.val.contains(t)));
}
