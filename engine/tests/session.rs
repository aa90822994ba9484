//! Sessions against the library loops they are built from, and the prompt cache's exactness.

use engine::prompt_cache::PromptCache;
use engine::testing::{drafter_dir, target_dir};
use engine::text::TextStream;
use engine::{Outcome, Request, Session};
use gemma4::generate::{generate, GenerateConfig};
use gemma4::sampling::SamplerConfig;
use gemma4::tokenizer::Tokenizer;
use gemma4::Model;
use spec_decode::{load_drafter, speculative_generate, Drafter, Pruning, SpecConfig, SpecStats};

fn samplers() -> Vec<(SamplerConfig, u64)> {
    vec![
        (SamplerConfig::greedy(), 0),
        (
            SamplerConfig {
                temperature: 0.8,
                top_p: 0.9,
                top_k: 0,
                min_p: 0.0,
                min_tokens_to_keep: 1,
                ..Default::default()
            },
            11,
        ),
        (
            SamplerConfig {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 40,
                min_p: 0.05,
                min_tokens_to_keep: 1,
                ..Default::default()
            },
            5,
        ),
    ]
}

fn request(prompt: &[u32], sampler: &SamplerConfig, seed: u64, max_tokens: usize, step: usize) -> Request {
    Request {
        prompt: prompt.to_vec(),
        generate: GenerateConfig {
            max_tokens,
            sampler: sampler.clone(),
            seed,
            prefill_step: step,
            stop_tokens: vec![1],
        },
        stop: vec![],
        gamma: None,
        pruning: Pruning::Off,
        kept_tokens: vec![],
        seeded: true,
        adaptive: false,
    }
}

fn run(
    m: &Model,
    mut d: Option<&mut (dyn Drafter + 'static)>,
    req: &Request,
    tok: Option<&Tokenizer>,
    cache: Option<&mut PromptCache>,
) -> Outcome {
    let s = Session::start(m, d.as_deref_mut(), req, tok, cache).unwrap();
    s.run(d, |_| {}).unwrap()
}

#[test]
fn sessions_decode_exactly_as_the_library_loops() {
    let m = Model::load(target_dir()).unwrap();
    let tok = Tokenizer::from_dir(target_dir()).unwrap();
    let mut d = load_drafter(drafter_dir(), m.config()).unwrap();
    let prompt: Vec<u32> = vec![2, 40, 41, 42, 43, 44];
    let mut accepted = 0;
    for (sampler, seed) in samplers() {
        let req = request(&prompt, &sampler, seed, 24, 2048);
        let plain = run(&m, None, &req, Some(&tok), None);
        let want = generate(&m, &prompt, &req.generate, |_| {}).unwrap();
        assert_eq!(plain.tokens, want.tokens, "plain session vs generate, {sampler:?}");
        assert!(plain.speculation.is_none());

        let spec = run(&m, Some(d.as_mut()), &req, Some(&tok), None);
        let cfg = SpecConfig { generate: req.generate.clone(), ..SpecConfig::default() };
        let want = speculative_generate(&m, d.as_mut(), &prompt, &cfg, |_| {}).unwrap();
        assert_eq!(spec.tokens, want.tokens, "speculative session vs speculative_generate, {sampler:?}");
        let stats = spec.speculation.as_ref().unwrap();
        assert_eq!(stats, &SpecStats { decode_ms: stats.decode_ms, prefill_ms: stats.prefill_ms, ..want.stats });
        accepted += stats.accepted;
        if sampler.is_greedy() {
            assert_eq!(spec.tokens, plain.tokens, "greedy speculative == greedy plain");
        }
        // The streamed text is the decoding of the tokens.
        assert_eq!(spec.text, tok.decode(&spec.tokens).unwrap());
        assert!(!spec.tokens.is_empty());
    }
    assert!(accepted > 0, "the fitted drafter never had a draft accepted; the comparison is vacuous");
}

/// Prompts sharing prefixes with `a` on a prefill grid of 4: `b` shares `a`'s first two chunks
/// (8 tokens) and then differs; `c` repeats `a`; `d` has `a`'s head with another last token.
fn cache_prompts() -> Vec<(Vec<u32>, usize)> {
    let a: Vec<u32> = (4..15).collect(); // 11 tokens, head 10
    let mut b = a[..9].to_vec();
    b.extend(100..106); // differs from a at position 9
    let mut d = a[..10].to_vec();
    d.push(200);
    vec![(a.clone(), 0), (b, 8), (a, 10), (d, 10)]
}

#[test]
fn prompt_cache_reuse_is_bit_identical() {
    let m = Model::load(target_dir()).unwrap();
    let mut d = load_drafter(drafter_dir(), m.config()).unwrap();
    for (sampler, seed) in samplers() {
        for speculative in [false, true] {
            let mut cache = PromptCache::new(8);
            for (prompt, expect_cached) in cache_prompts() {
                let req = request(&prompt, &sampler, seed, 16, 4);
                let dr = if speculative { Some(d.as_mut()) } else { None };
                let warm = run(&m, dr, &req, None, Some(&mut cache));
                let dr = if speculative { Some(d.as_mut()) } else { None };
                let cold = run(&m, dr, &req, None, None);
                assert_eq!(warm.cached_tokens, expect_cached, "{prompt:?}");
                assert_eq!(cold.cached_tokens, 0);
                assert_eq!(warm.tokens, cold.tokens, "cache on vs off, speculative {speculative}, {sampler:?}");
                assert_eq!(warm.speculation.map(|s| s.accepted), cold.speculation.map(|s| s.accepted));
            }
            assert!(!cache.is_empty());
        }
    }
}

#[test]
fn a_prefix_off_the_chunk_grid_is_refused() {
    let m = Model::load(target_dir()).unwrap();
    let taps = gemma4::TapSet::new([]);
    let a: Vec<u32> = (4..15).collect();
    let mut states = Vec::new();
    spec_decode::prefill_from(&m, &taps, &a, 3, None, |s| states.push(s)).unwrap();
    // States after 3, 6, 9 and the whole head (10) tokens.
    let lens: Vec<usize> = states.iter().map(|s| s.tokens().len()).collect();
    assert_eq!(lens, [3, 6, 9, 10]);
    let longer: Vec<u32> = (4..30).collect();
    assert!(states[2].resumable_for(&taps, &longer, 3));
    // The head-only state (10) is off the grid of 3 for a longer prompt, and any state is off
    // another grid.
    assert!(!states[3].resumable_for(&taps, &longer, 3));
    assert!(!states[2].resumable_for(&taps, &longer, 4));
    let e = spec_decode::prefill_from(&m, &taps, &longer, 3, Some(&states[3]), |_| {}).unwrap_err();
    assert!(e.to_string().contains("chunk boundary"), "{e}");
    // Resuming on the grid gives the from-scratch cache bit for bit.
    let resumed = spec_decode::prefill_from(&m, &taps, &longer, 3, Some(&states[2]), |_| {}).unwrap();
    let scratch = spec_decode::prefill(&m, &taps, &longer, 3).unwrap();
    let bytes = |p: &spec_decode::Prefilled| -> Vec<Vec<u8>> {
        p.cache().eval().unwrap();
        (0..p.cache().len())
            .flat_map(|i| {
                p.cache().layer(i).unwrap().state().into_iter().map(|a| a.to_bytes().unwrap()).collect::<Vec<_>>()
            })
            .collect()
    };
    assert_eq!(bytes(&resumed), bytes(&scratch));
}

#[test]
fn stop_strings_match_across_tokens_and_hold_back_prefixes() {
    let tok = Tokenizer::from_dir(target_dir()).unwrap();
    let mut ts = TextStream::new(&tok, &["t6 t".to_string()]);
    assert_eq!(ts.push(5).unwrap().text, "t5");
    // " t6" could start the stop string: "t6" is held back.
    let p = ts.push(6).unwrap();
    assert_eq!((p.text.as_str(), p.stopped), (" ", false));
    let p = ts.push(7).unwrap();
    assert_eq!((p.text.as_str(), p.stopped), ("", true));
    assert_eq!(ts.text(), "t5 ");
    assert!(ts.push(8).unwrap().stopped, "nothing after a stop");

    // Held-back text is released when it turns out not to be a stop string.
    let mut ts = TextStream::new(&tok, &["t6 t9".to_string()]);
    let mut text = String::new();
    for t in [5, 6, 7] {
        text.push_str(&ts.push(t).unwrap().text);
    }
    text.push_str(&ts.flush());
    assert_eq!(text, tok.decode(&[5, 6, 7]).unwrap());
}
