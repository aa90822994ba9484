//! Property tests across gemma4 and spec-decode: the drafter's context always holds exactly the
//! committed tokens, speculative greedy output is plain greedy output for random γ, prompts and
//! limits (stop tokens included), and rolling the target caches back after random accept counts
//! leaves them equivalent to caches that never saw the rejected tokens.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use dspark_tests::{prompt, scratch, target_checkpoint};
use gemma4::config::tiny_config_a;
use gemma4::generate::{generate, ids_array, GenerateConfig};
use gemma4::{Model, TapSet};
use mlx_core::Array;
use proptest::prelude::*;
use spec_decode::dspark::{DSparkConfig, DSparkDrafter};
use spec_decode::oracle::SelfDrafter;
use spec_decode::{speculative_generate, DraftRequest, Drafter, Proposal, Pruning, SpecConfig};

fn target_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| target_checkpoint(&scratch("prop-spec-target-a"), &tiny_config_a(), 77)).clone()
}

/// Wraps a drafter and checks the context invariant at every call.
struct Checked {
    inner: Box<dyn Drafter>,
    log: Rc<RefCell<Vec<String>>>,
    committed: usize,
}

impl Drafter for Checked {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn gamma(&self) -> usize {
        self.inner.gamma()
    }
    fn taps(&self) -> TapSet {
        self.inner.taps()
    }
    fn has_confidence(&self) -> bool {
        self.inner.has_confidence()
    }
    fn thresholds(&self) -> Option<Vec<f32>> {
        self.inner.thresholds()
    }
    fn reset(&mut self, ctx: Option<&Array>, len: usize) -> spec_decode::Result<()> {
        if let Some(c) = ctx {
            if c.dim(1).unwrap() != len as i32 {
                self.log.borrow_mut().push(format!("reset with {:?} rows for {len}", c.shape().unwrap()));
            }
        }
        self.committed = len;
        self.inner.reset(ctx, len)
    }
    fn context_len(&self) -> usize {
        self.inner.context_len()
    }
    fn propose(&mut self, req: DraftRequest<'_>) -> spec_decode::Result<Proposal> {
        if req.position != self.inner.context_len()
            || req.position != self.committed
            || req.target_cache.offset() != req.position
        {
            self.log.borrow_mut().push(format!(
                "propose at {} with context {} (committed {}, cache {})",
                req.position,
                self.inner.context_len(),
                self.committed,
                req.target_cache.offset()
            ));
        }
        self.inner.propose(req)
    }
    fn commit(&mut self, rows: Option<&Array>, k: usize) -> spec_decode::Result<()> {
        if let Some(r) = rows {
            if r.dim(1).unwrap() != k as i32 {
                self.log.borrow_mut().push(format!("commit of {k} with {:?}", r.shape().unwrap()));
            }
        }
        self.committed += k;
        self.inner.commit(rows, k)
    }
}

fn dspark(model: &Model, seed: u64) -> DSparkDrafter {
    let n = model.config().num_hidden_layers;
    let cfg = DSparkConfig {
        gamma: 6,
        d_draft: 32,
        n_layers: 1,
        n_heads: 2,
        markov_rank: 8,
        ff_mult: 2,
        tap_layers: vec![0, n],
        seq_head: None,
        sts: None,
        ctx_window: None,
        conf_law: false,
        greedy_head: false,
    };
    DSparkDrafter::init(cfg, model.config(), "tiny", seed, true).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn spec_greedy_is_plain_greedy_and_context_tracks_commits(
        gamma in 1usize..=6,
        plen in 1usize..=14,
        salt in 0u32..1000,
        max_tokens in 1usize..=40,
        use_self in any::<bool>(),
        prune in any::<bool>(),
        stop_at in proptest::option::of(0usize..40),
    ) {
        let model = Model::load(&target_dir()).unwrap();
        let p = prompt(plen, 512, salt);
        let plain_all = generate(&model, &p, &GenerateConfig { max_tokens, ..Default::default() }, |_| {}).unwrap().tokens;
        // A stop token taken from the plain output makes the stop land inside a round.
        let stop: Vec<u32> = stop_at.and_then(|i| plain_all.get(i).copied()).into_iter().collect();
        let cfg = SpecConfig {
            generate: GenerateConfig { max_tokens, stop_tokens: stop.clone(), prefill_step: 5, ..Default::default() },
            gamma: Some(gamma),
            // Pruning needs a confidence head; the self drafter has none.
            pruning: if prune && !use_self { Pruning::MinConf(0.5) } else { Pruning::Off },
        };
        let plain = generate(&model, &p, &cfg.generate, |_| {}).unwrap().tokens;
        let log = Rc::new(RefCell::new(Vec::new()));
        let inner: Box<dyn Drafter> = if use_self { Box::new(SelfDrafter::new(6)) } else { Box::new(dspark(&model, salt as u64)) };
        let mut d = Checked { inner, log: log.clone(), committed: 0 };
        let out = speculative_generate(&model, &mut d, &p, &cfg, |_| {}).unwrap();
        prop_assert_eq!(&out.tokens, &plain, "γ={} stop={:?} {}", gamma, stop, out.stats.summary());
        prop_assert!(log.borrow().is_empty(), "{:?}", log.borrow());
        prop_assert_eq!(out.stats.emitted, plain.len());
        prop_assert!(out.stats.accepted <= out.stats.drafted);
    }

    #[test]
    fn rollback_matches_a_cache_that_never_saw_the_rejected_tokens(
        rounds in proptest::collection::vec((1usize..=5, 0usize..=5, 0u32..500), 1..12),
        plen in 2usize..=12,
    ) {
        let model = Model::load(&target_dir()).unwrap();
        let p = prompt(plen, 512, 3);
        let mut spec = model.new_cache();
        let mut twin = model.new_cache();
        model.forward(&ids_array(&p).unwrap(), Some(&mut spec)).unwrap();
        model.forward(&ids_array(&p).unwrap(), Some(&mut twin)).unwrap();
        let mut committed: Vec<u32> = p.clone();
        for (d, a, salt) in rounds {
            let a = a.min(d);
            // A verify window of the pending token plus d drafts, of which a are accepted; the
            // twin decodes only the kept tokens, one step at a time, as plain decoding would.
            let window: Vec<u32> = (0..=d as u32).map(|i| 4 + (salt + i * 29) % 500).collect();
            model.forward_stepwise(&ids_array(&window).unwrap(), &mut spec, None).unwrap();
            spec.trim(d - a).unwrap();
            for &t in &window[..=a] {
                model.forward_stepwise(&ids_array(&[t]).unwrap(), &mut twin, None).unwrap();
            }
            committed.extend_from_slice(&window[..=a]);
            prop_assert_eq!(spec.offset(), committed.len());
            prop_assert_eq!(twin.offset(), committed.len());
            // The next query (scored stepwise, as the next verify scores it) sees exactly the
            // same keys and values: bit-identical logits.
            prop_assert_eq!(probe(&model, &spec), probe(&model, &twin), "rolled-back cache differs from the twin");
        }
    }
}

/// Logits of token 7 after `cache`, scored stepwise (the cache is not modified) // raw bytes
fn probe(model: &Model, cache: &gemma4::Cache) -> Vec<u8> {
    let out = model.forward_stepwise(&ids_array(&[7]).unwrap(), &mut cache.clone(), None).unwrap();
    model.logits_from_hidden(&out.hidden).unwrap().to_bytes().unwrap()
}

#[test]
fn a_kept_rejected_token_is_detected() {
    // The bit-equality check has teeth: a cache that still holds one wrong token differs.
    let model = Model::load(&target_dir()).unwrap();
    let p = prompt(6, 512, 9);
    let mut good = model.new_cache();
    model.forward(&ids_array(&p).unwrap(), Some(&mut good)).unwrap();
    let mut bad = good.clone();
    model.forward_stepwise(&ids_array(&[100]).unwrap(), &mut bad, None).unwrap();
    model.forward_stepwise(&ids_array(&[200]).unwrap(), &mut good, None).unwrap();
    assert_ne!(probe(&model, &good), probe(&model, &bad));
}
