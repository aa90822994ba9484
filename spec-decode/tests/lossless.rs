//! Greedy speculative decoding must emit exactly plain greedy decoding's tokens, whatever the
//! drafter proposes; the self-drafter shows acceptances really happen.

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::generate::{generate, GenerateConfig};
use gemma4::Model;
use mlx_core::Dtype;
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::oracle::SelfDrafter;
use spec_decode::{speculative_generate, Drafter, Pruning, SpecConfig};

fn target() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = gemma4::testing::scratch("spec-tiny-a");
        write_random_checkpoint(&dir, &tiny_config_a(), 1234, Dtype::Bf16, 1, true).unwrap()
    })
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 4 + (i * 37 + 11) % 500).collect()
}

fn small_dspark(model: &Model, gamma: usize) -> DSparkDrafter {
    let n = model.config().num_hidden_layers;
    let cfg = DSparkConfig { gamma, ..DSparkConfig::with_taps(vec![1, 3, n]) };
    DSparkDrafter::init(cfg, model.config(), "tiny-a", 7, true).unwrap()
}

fn spec_cfg(gamma: usize, max: usize, pruning: Pruning) -> SpecConfig {
    SpecConfig { generate: GenerateConfig { max_tokens: max, ..Default::default() }, gamma: Some(gamma), pruning }
}

#[test]
fn greedy_spec_equals_plain_greedy() {
    let model = Model::load(target()).unwrap();
    let p = prompt(21);
    let max = 96;
    let plain = generate(&model, &p, &spec_cfg(1, max, Pruning::Off).generate, |_| {}).unwrap().tokens;
    for gamma in [1, 3, 5] {
        let mut d: Box<dyn Drafter> = Box::new(SelfDrafter::new(gamma));
        let out = speculative_generate(&model, d.as_mut(), &p, &spec_cfg(gamma, max, Pruning::Off), |_| {}).unwrap();
        assert_eq!(out.tokens, plain, "self drafter γ={gamma}: {}", out.stats.summary());
        assert!(out.stats.accepted > 0, "self drafter must get acceptances: {}", out.stats.summary());
        for pruning in [Pruning::Off, Pruning::MinConf(0.5)] {
            let mut d = small_dspark(&model, gamma);
            let out = speculative_generate(&model, &mut d, &p, &spec_cfg(gamma, max, pruning.clone()), |_| {}).unwrap();
            assert_eq!(out.tokens, plain, "dspark γ={gamma} {pruning:?}: {}", out.stats.summary());
            // The loop checks H_ctx length == target cache offset before every round (a contract
            // error otherwise); at exit the last round's rows are not committed.
            let ctx = d.context_len();
            assert!(ctx >= p.len() - 1 && ctx < p.len() + out.tokens.len(), "H_ctx length {ctx}");
        }
    }
}

#[test]
fn sampled_spec_is_seeded_and_reproducible() {
    let model = Model::load(target()).unwrap();
    let p = prompt(9);
    let sampler = gemma4::sampling::SamplerConfig { temperature: 1.0, top_k: 40, ..Default::default() };
    let run = |seed: u64| {
        let mut d = small_dspark(&model, 3);
        let mut cfg = spec_cfg(3, 48, Pruning::Off);
        cfg.generate.sampler = sampler.clone();
        cfg.generate.seed = seed;
        speculative_generate(&model, &mut d, &p, &cfg, |_| {}).unwrap()
    };
    let (a, b, c) = (run(5), run(5), run(6));
    assert_eq!(a.tokens, b.tokens, "same seed, same tokens");
    assert_ne!(a.tokens, c.tokens, "another seed draws other tokens");
    assert_eq!(a.tokens.len(), 48);
    assert!(
        a.stats.host_syncs <= a.stats.target_forwards(),
        "at most one host sync per target forward without pruning: {}",
        a.stats.summary()
    );
}

#[test]
fn greedy_spec_with_a_logit_bias_equals_plain_greedy_with_it() {
    let model = Model::load(target()).unwrap();
    let p = prompt(17);
    let max = 64;
    let unbiased = generate(&model, &p, &spec_cfg(1, max, Pruning::Off).generate, |_| {}).unwrap().tokens;
    // Ban the first pick, push a few other tokens by amounts that are not bf16 round numbers:
    // the biased law must be formed the same way in the plain step and in every verify row.
    let bias = vec![(unbiased[0], -100.0), (unbiased[7], -2.37), (17, 3.1), (250, 4.6), (401, 2.05)];
    let with_bias = |gamma: usize| {
        let mut c = spec_cfg(gamma, max, Pruning::Off);
        c.generate.sampler.logit_bias = bias.clone();
        c
    };
    let plain = generate(&model, &p, &with_bias(1).generate, |_| {}).unwrap().tokens;
    assert_ne!(plain, unbiased, "the bias must change the greedy output");
    assert_ne!(plain[0], unbiased[0], "a -100 bias removes the unbiased first pick");
    for gamma in [1, 3, 5] {
        let mut d = SelfDrafter::new(gamma);
        let out = speculative_generate(&model, &mut d, &p, &with_bias(gamma), |_| {}).unwrap();
        assert_eq!(out.tokens, plain, "self drafter γ={gamma}: {}", out.stats.summary());
        assert!(out.stats.accepted > 0, "some drafts accepted: {}", out.stats.summary());
        let mut d = small_dspark(&model, gamma);
        let out = speculative_generate(&model, &mut d, &p, &with_bias(gamma), |_| {}).unwrap();
        assert_eq!(out.tokens, plain, "dspark γ={gamma}: {}", out.stats.summary());
    }
    // A +100 bias makes greedy emit that token every step, speculative or not.
    let mut c = spec_cfg(3, 12, Pruning::Off);
    c.generate.sampler.logit_bias = vec![(321, 100.0)];
    assert_eq!(generate(&model, &p, &c.generate, |_| {}).unwrap().tokens, vec![321; 12]);
    let out = speculative_generate(&model, &mut small_dspark(&model, 3), &p, &c, |_| {}).unwrap();
    assert_eq!(out.tokens, vec![321; 12]);
    // An id past the vocabulary is refused by both, naming the field.
    c.generate.sampler.logit_bias = vec![(model.config().vocab_size as u32, 1.0)];
    let e = generate(&model, &p, &c.generate, |_| {}).unwrap_err().to_string();
    assert!(e.contains("logit_bias"), "{e}");
    let e = speculative_generate(&model, &mut small_dspark(&model, 3), &p, &c, |_| {}).unwrap_err().to_string();
    assert!(e.contains("logit_bias"), "{e}");
}
