//! Properties of the acceptance rules in `spec_decode::accept`, over small random vocabularies.
//!
//! Distributions come in two flavours: *dyadic* rows (every entry `k / 1024`, so they are exact
//! in f32 and sum to exactly 1 in f64, which lets the losslessness identity be checked to 1e-9)
//! and *float* rows (arbitrary weights normalised and rounded to f32, as a real softmax would
//! give). Both put zeros in many rows.

use mlx_core::Array;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use spec_decode::accept::{
    first_rejection_or_bonus, greedy_accept, residual, speculative_sample, step_distribution, NextToken, Verdict,
};
use spec_decode::probs::sample_rows;
use spec_decode::verify::{accept_flags, residual_weights};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(0x5eed_acce_97ed),
        // The seed is fixed, so a failure reproduces without a regressions file.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const DYADIC_DENOM: u32 = 1024;

/// A distribution over `v` tokens with entries `k / 1024`. Cut points on a coarse grid collide
/// often, which makes zero entries common.
fn dyadic_dist(v: usize) -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![Just(4u32), Just(16u32), Just(DYADIC_DENOM)].prop_flat_map(move |grid| {
        prop::collection::vec(0..=grid, v - 1).prop_map(move |mut cuts| {
            cuts.sort_unstable();
            let scale = DYADIC_DENOM / grid;
            let mut prev = 0u32;
            let mut row = Vec::with_capacity(v);
            for c in cuts.into_iter().chain(std::iter::once(grid)) {
                row.push(((c - prev) * scale) as f32 / DYADIC_DENOM as f32);
                prev = c;
            }
            row
        })
    })
}

/// A distribution over `v` tokens from arbitrary weights (about a quarter of them zero),
/// normalised in f64 and rounded to f32.
fn float_dist(v: usize) -> impl Strategy<Value = Vec<f32>> {
    (prop::collection::vec((any::<bool>(), any::<bool>(), 1e-6f64..1.0), v), 0..v).prop_map(|(entries, keep)| {
        let weights: Vec<f64> =
            entries.iter().enumerate().map(|(i, &(a, b, w))| if i != keep && a && b { 0.0 } else { w }).collect();
        let total: f64 = weights.iter().sum();
        weights.iter().map(|w| (w / total) as f32).collect()
    })
}

fn any_dist(v: usize) -> BoxedStrategy<Vec<f32>> {
    prop_oneof![dyadic_dist(v), float_dist(v)].boxed()
}

/// A token with positive probability in `row`, chosen by `pick`.
fn token_with_mass(row: &[f32], pick: usize) -> u32 {
    let support: Vec<usize> = (0..row.len()).filter(|&i| row[i] > 0.0).collect();
    support[pick % support.len()] as u32
}

/// A uniform source cycling through `values` (all in [0, 1)).
fn cycle(values: Vec<f32>) -> impl FnMut() -> f32 {
    let mut i = 0;
    move || {
        let u = values[i % values.len()];
        i += 1;
        u
    }
}

/// `d` drafts, `d + 1` target rows and `d` draft rows over a shared vocabulary of 2..12.
#[derive(Debug, Clone)]
struct Round {
    drafts: Vec<u32>,
    p_rows: Vec<Vec<f32>>,
    q_rows: Vec<Vec<f32>>,
}

fn round(q_equals_p: bool) -> impl Strategy<Value = Round> {
    (2usize..12, 0usize..6).prop_flat_map(move |(v, d)| {
        (
            prop::collection::vec(any_dist(v), d + 1),
            prop::collection::vec(any_dist(v), d),
            prop::collection::vec(any::<usize>(), d),
        )
            .prop_map(move |(p_rows, q_free, picks)| {
                let q_rows = if q_equals_p { p_rows[..d].to_vec() } else { q_free };
                let drafts = q_rows.iter().zip(&picks).map(|(q, &k)| token_with_mass(q, k)).collect();
                Round { drafts, p_rows, q_rows }
            })
    })
}

fn rows(r: &[Vec<f32>]) -> Vec<&[f32]> {
    r.iter().map(Vec::as_slice).collect()
}

fn uniforms() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(0.0f32..1.0, 1..16)
}

proptest! {
    #![proptest_config(config())]

    /// The emitted token of one speculative step is distributed exactly as p, for any q.
    #[test]
    fn step_distribution_equals_target(
        (p, q) in (2usize..12).prop_flat_map(|v| (dyadic_dist(v), dyadic_dist(v)))
    ) {
        let emitted = step_distribution(&p, &q);
        prop_assert_eq!(emitted.len(), p.len());
        for (t, (&e, &pt)) in emitted.iter().zip(&p).enumerate() {
            prop_assert!((e - f64::from(pt)).abs() < 1e-9, "token {}: emitted {} vs p {}", t, e, pt);
        }
    }

    /// With rows rounded to f32, the identity holds up to how far p's sum is from 1.
    #[test]
    fn step_distribution_tracks_target_under_f32_rounding(
        (p, q) in (2usize..12).prop_flat_map(|v| (float_dist(v), float_dist(v)))
    ) {
        let p_sum: f64 = p.iter().map(|&x| f64::from(x)).sum();
        let bound = (1.0 - p_sum).abs() + 1e-12;
        for (t, (&e, &pt)) in step_distribution(&p, &q).iter().zip(&p).enumerate() {
            prop_assert!((e - f64::from(pt)).abs() <= bound, "token {}: emitted {} vs p {}", t, e, pt);
        }
    }

    /// The device ops the decode loop runs carry the reference law: the residual they sample is
    /// `accept::residual` (p where that is empty), a draft x passes the accept flags for a
    /// fraction min(1, p(x)/q(x)) of the uniforms, and composed they emit exactly p.
    #[test]
    fn device_verify_ops_compose_to_the_target_law(
        (p, q) in (2usize..12).prop_flat_map(|v| (float_dist(v), float_dist(v)))
    ) {
        let v = p.len();
        let row = |x: &[f32]| Array::from_slice(x, &[1, v as i32]).unwrap();
        let w = residual_weights(&row(&p), &row(&q)).unwrap().to_f32_vec().unwrap();
        let mass: f32 = w.iter().sum();
        let r: Vec<f32> = w.iter().map(|x| x / mass).collect();
        let want = residual(&p, &q).unwrap_or_else(|| p.clone());
        for t in 0..v {
            prop_assert!((r[t] - want[t]).abs() < 1e-5, "residual at {}: device {} vs host {}", t, r[t], want[t]);
        }
        // Accept flags over a grid of 1024 uniforms, for every token the draft could have drawn.
        const N: usize = 1024;
        let u: Vec<f32> = (0..N).map(|k| (k as f32 + 0.5) / N as f32).collect();
        let u = Array::from_slice(&u, &[N as i32]).unwrap();
        let mut law = vec![0f64; v];
        for x in (0..v).filter(|&x| q[x] > 0.0) {
            let full = |val: f32| Array::full(&[N as i32], val as f64, mlx_core::Dtype::F32).unwrap();
            let flags = accept_flags(&u, &full(p[x]), &full(q[x])).unwrap().to_vec::<bool>().unwrap();
            let rate = flags.iter().filter(|&&f| f).count() as f64 / N as f64;
            let a = (f64::from(p[x]) / f64::from(q[x])).min(1.0);
            prop_assert!((rate - a).abs() <= 1.0 / N as f64, "token {}: accepted {} of uniforms, min(1, p/q) = {}", x, rate, a);
            law[x] += f64::from(q[x]) * a;
            for t in 0..v {
                law[t] += f64::from(q[x]) * (1.0 - a) * f64::from(r[t]);
            }
        }
        let bound = (1.0 - p.iter().map(|&x| f64::from(x)).sum::<f64>()).abs() + 1e-4;
        for t in 0..v {
            prop_assert!((law[t] - f64::from(p[t])).abs() <= bound, "token {}: emitted {} vs p {}", t, law[t], p[t]);
        }
    }

    /// Inverse-CDF draws over a grid of N uniforms land on each token in proportion to its
    /// weight (within one grid step plus f32 rounding), never on a zero weight, and a uniform
    /// just under 1 still lands on the last positive weight.
    #[test]
    fn inverse_cdf_draws_follow_the_weights(
        (w, scale) in ((2usize..40).prop_flat_map(float_dist), 1e-6f32..8.0)
    ) {
        const N: usize = 4096;
        let v = w.len();
        let weights: Vec<f32> = w.iter().map(|x| x * scale).collect();
        let rows = Array::from_slice(&weights.repeat(N + 1), &[N as i32 + 1, v as i32]).unwrap();
        let mut u: Vec<f32> = (0..N).map(|k| (k as f32 + 0.5) / N as f32).collect();
        u.push(1.0 - f32::EPSILON / 2.0);
        let picks = sample_rows(&rows, &Array::from_slice(&u, &[N as i32 + 1]).unwrap()).unwrap().to_vec::<u32>().unwrap();
        let mut counts = vec![0usize; v];
        for &t in &picks[..N] {
            prop_assert!((t as usize) < v && w[t as usize] > 0.0, "drew token {} of weight {:?}", t, w.get(t as usize));
            counts[t as usize] += 1;
        }
        let last_positive = (0..v).rev().find(|&t| w[t] > 0.0).unwrap();
        prop_assert_eq!(picks[N] as usize, last_positive);
        let total: f64 = w.iter().map(|&x| f64::from(x)).sum();
        for t in 0..v {
            let want = f64::from(w[t]) / total;
            let got = counts[t] as f64 / N as f64;
            prop_assert!((got - want).abs() <= 1.0 / N as f64 + 1e-5, "token {}: drawn {} vs weight {}", t, got, want);
        }
    }

    /// The residual is a distribution supported exactly where p > q, and is absent iff p == q.
    #[test]
    fn residual_is_normalised_positive_part(
        (p, q) in (2usize..12).prop_flat_map(|v| (dyadic_dist(v), dyadic_dist(v)))
    ) {
        match residual(&p, &q) {
            None => prop_assert_eq!(&p, &q),
            Some(r) => {
                prop_assert_eq!(r.len(), p.len());
                let sum: f64 = r.iter().map(|&x| f64::from(x)).sum();
                prop_assert!((sum - 1.0).abs() < 1e-6, "residual sums to {}", sum);
                for t in 0..p.len() {
                    if q[t] >= p[t] {
                        prop_assert_eq!(r[t], 0.0, "token {} has q >= p", t);
                    } else {
                        prop_assert!(r[t] > 0.0, "token {} has p > q", t);
                    }
                }
            }
        }
    }

    /// Same as above for f32-rounded rows (zero-mass residuals may appear only when p ≤ q).
    #[test]
    fn residual_of_float_rows(
        (p, q) in (2usize..12).prop_flat_map(|v| (float_dist(v), float_dist(v)))
    ) {
        if let Some(r) = residual(&p, &q) {
            let sum: f64 = r.iter().map(|&x| f64::from(x)).sum();
            prop_assert!((sum - 1.0).abs() < 1e-5, "residual sums to {}", sum);
            for t in 0..p.len() {
                if q[t] >= p[t] {
                    prop_assert_eq!(r[t], 0.0);
                }
            }
        } else {
            prop_assert!(p.iter().zip(&q).all(|(a, b)| a <= b));
        }
    }

    /// Greedy acceptance is the longest matching prefix; the next token is the argmax after it.
    #[test]
    fn greedy_accept_is_longest_matching_prefix(
        (target, drafts) in (2usize..12, 0usize..8).prop_flat_map(|(v, d)| {
            let v = v as u32;
            (
                prop::collection::vec(0..v, d + 1),
                prop::collection::vec(0..v, d),
                0..=d,
            )
                .prop_map(move |(target, tail, copied)| {
                    let drafts: Vec<u32> =
                        target[..copied].iter().chain(&tail[copied..]).copied().collect();
                    (target, drafts)
                })
        })
    ) {
        let mut naive = 0;
        while naive < drafts.len() && drafts[naive] == target[naive] {
            naive += 1;
        }
        let verdict = greedy_accept(&drafts, &target);
        prop_assert_eq!(verdict.accepted, naive);
        prop_assert_eq!(verdict.next.token(), target[naive]);
        prop_assert_eq!(verdict.next.is_bonus(), naive == drafts.len());
        prop_assert_eq!(verdict.emitted(), naive + 1);
    }

    /// A drafter whose q equals p is accepted on every draft and earns the bonus.
    #[test]
    fn speculative_sample_accepts_everything_when_q_is_p(r in round(true), us in uniforms()) {
        let verdict = speculative_sample(
            &r.drafts, &rows(&r.q_rows), &rows(&r.p_rows), &mut cycle(us),
        ).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let d = r.drafts.len();
        prop_assert_eq!(verdict.accepted, d);
        let NextToken::Bonus(bonus) = verdict.next else {
            return Err(TestCaseError::fail("expected a bonus token"));
        };
        prop_assert!(r.p_rows[d][bonus as usize] > 0.0, "bonus {} has p = 0", bonus);
    }

    /// For any q: accepted drafts have p > 0, a recovered token comes from where p > q (or from
    /// p when the residual is empty), and a bonus comes from the support of the last row.
    #[test]
    fn speculative_sample_emits_only_supported_tokens(r in round(false), us in uniforms()) {
        let verdict = speculative_sample(
            &r.drafts, &rows(&r.q_rows), &rows(&r.p_rows), &mut cycle(us),
        ).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let k = verdict.accepted;
        prop_assert!(k <= r.drafts.len());
        for i in 0..k {
            prop_assert!(r.p_rows[i][r.drafts[i] as usize] > 0.0, "accepted draft {} has p = 0", i);
        }
        match verdict.next {
            NextToken::Recovered(t) => {
                prop_assert!(k < r.drafts.len());
                let (p, q) = (&r.p_rows[k], &r.q_rows[k]);
                if residual(p, q).is_some() {
                    prop_assert!(p[t as usize] > q[t as usize], "recovered {} has p <= q", t);
                } else {
                    prop_assert!(p[t as usize] > 0.0);
                }
            }
            NextToken::Bonus(t) => {
                prop_assert_eq!(k, r.drafts.len());
                prop_assert!(r.p_rows[k][t as usize] > 0.0, "bonus {} has p = 0", t);
            }
        }
    }

    /// Greedy verification is speculative sampling's limit with one-hot p and q rows: the two
    /// rules agree whenever every row is a point mass.
    #[test]
    fn one_hot_rows_reduce_to_greedy(
        (v, target, drafts) in (2usize..12, 0usize..6).prop_flat_map(|(v, d)| {
            (
                Just(v),
                prop::collection::vec(0..v as u32, d + 1),
                prop::collection::vec(0..v as u32, d),
            )
        }),
        us in uniforms(),
    ) {
        let one_hot = |t: u32| -> Vec<f32> {
            (0..v).map(|i| if i == t as usize { 1.0 } else { 0.0 }).collect()
        };
        let p_rows: Vec<Vec<f32>> = target.iter().map(|&t| one_hot(t)).collect();
        let q_rows: Vec<Vec<f32>> = drafts.iter().map(|&t| one_hot(t)).collect();
        let sampled = speculative_sample(&drafts, &rows(&q_rows), &rows(&p_rows), &mut cycle(us))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let greedy: Verdict = greedy_accept(&drafts, &target);
        prop_assert_eq!(sampled, greedy);
    }

    /// The device verifier's selection, fed greedy flags (draft == pick), is the greedy reference.
    #[test]
    fn selection_matches_greedy_accept(
        (target, drafts) in (2usize..12, 0usize..8).prop_flat_map(|(v, d)| {
            let v = v as u32;
            (prop::collection::vec(0..v, d + 1), prop::collection::vec(0..v, d), 0..=d).prop_map(
                move |(target, tail, copied)| {
                    let drafts: Vec<u32> = target[..copied].iter().chain(&tail[copied..]).copied().collect();
                    (target, drafts)
                },
            )
        })
    ) {
        let d = drafts.len();
        let flags: Vec<bool> = drafts.iter().zip(&target).map(|(a, b)| a == b).collect();
        let selected = first_rejection_or_bonus(&flags, &target[..d], target[d])
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(selected, greedy_accept(&drafts, &target));
    }

    /// The device verifier's selection, fed each position's own test and candidates (every
    /// flag, recovered token and the bonus computed independently, as the device does in one
    /// pass), gives exactly the sequential reference's verdict on the same draws.
    #[test]
    fn selection_matches_speculative_sample(
        r in round(false),
        accept_us in prop::collection::vec(0.0f32..1.0, 6),
        residual_u in 0.0f32..1.0,
        bonus_u in 0.0f32..1.0,
    ) {
        let d = r.drafts.len();
        let fail = |e: spec_decode::accept::AcceptError| TestCaseError::fail(e.to_string());
        let (mut flags, mut recovered) = (Vec::new(), Vec::new());
        for (k, &u) in accept_us.iter().enumerate().take(d) {
            let (p, q) = (r.p_rows[k].as_slice(), r.q_rows[k].as_slice());
            let one = speculative_sample(&r.drafts[k..=k], &[q], &[p, p], &mut cycle(vec![u, residual_u]))
                .map_err(fail)?;
            flags.push(one.accepted == 1);
            recovered.push(if one.accepted == 1 { u32::MAX } else { one.next.token() });
        }
        let bonus = speculative_sample(&[], &[], &[r.p_rows[d].as_slice()], &mut cycle(vec![bonus_u]))
            .map_err(fail)?
            .next
            .token();
        let selected = first_rejection_or_bonus(&flags, &recovered, bonus).map_err(fail)?;
        // The sequential reference draws lazily: the accept draws up to the first rejection, then
        // the residual draw, or the bonus draw if nothing was rejected.
        let mut stream: Vec<f32> = accept_us[..flags.iter().position(|f| !f).map_or(d, |k| k + 1)].to_vec();
        stream.push(if selected.next.is_bonus() { bonus_u } else { residual_u });
        let reference = speculative_sample(&r.drafts, &rows(&r.q_rows), &rows(&r.p_rows), &mut cycle(stream))
            .map_err(fail)?;
        prop_assert_eq!(selected, reference);
    }

    /// Flags and candidates of different lengths are refused, not indexed out of bounds.
    #[test]
    fn selection_refuses_mismatched_lengths(d in 0usize..6, extra in 1usize..3) {
        let flags = vec![true; d];
        prop_assert!(first_rejection_or_bonus(&flags, &vec![0; d + extra], 0).is_err());
    }
}
