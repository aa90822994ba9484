//! Property tests of the KV caches against a plain `Vec` reference, and of rollback through a
//! real model at bit equality.
//!
//! Every written row carries its identity: K[.., 0] = absolute position, K[.., 1] = a stamp
//! unique to that write, V = (position + 0.5, stamp). The reference is the `Vec<Tok>` of
//! committed tokens (a trim pops them, so a re-written position gets a new stamp and a stale
//! row that survived a rollback is always detected). After every operation the test checks:
//!
//! - the fetched buffer, exactly (full: all committed tokens in order; rotating concat write of
//!   S rows: the last min(old_len, w − 1) committed tokens followed by the S new ones, in
//!   temporal order; rotating single-token write: the last min(len, w) committed tokens, as a
//!   cyclic rotation of their temporal order, i.e. ring order);
//! - what every new query actually sees through the mask `gemma4::mask` builds for that write
//!   (exactly the last w positions up to and including itself for sliding layers, everything up
//!   to itself for full layers), and that an array mask has exactly one column per buffer row;
//! - `retained()`: the suffix of the committed tokens whose length follows mlx-lm's layout rules
//!   (tracked by the reference), never shorter than min(len, w);
//! - `offset()` equals the committed length;
//! - `check_trim` / `trim`: allowed exactly when mlx-lm (offset < w) or the exact rollback
//!   (n ≤ the rows of the last multi-token write − 1, minus what was already rolled back)
//!   allows it; a refused trim returns the right `CacheError` and changes nothing.

mod common;

use std::collections::BTreeSet;

use gemma4::cache::{KvCache, RotatingKvCache};
use gemma4::generate::ids_array;
use gemma4::mask::{full_mask, sliding_mask, AttnMask};
use gemma4::Model;
use gemma4::{CacheError, Error, LayerCache};
use mlx_core::Array;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// One cached row: absolute position and the stamp of the write that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Tok {
    pos: u32,
    stamp: u32,
}

/// K and V `[1, 1, S, 2]` for `toks`.
fn rows(toks: &[Tok]) -> (Array, Array) {
    let k: Vec<f32> = toks.iter().flat_map(|t| [t.pos as f32, t.stamp as f32]).collect();
    let v: Vec<f32> = toks.iter().flat_map(|t| [t.pos as f32 + 0.5, t.stamp as f32]).collect();
    let s = toks.len() as i32;
    (Array::from_slice(&k, &[1, 1, s, 2]).unwrap(), Array::from_slice(&v, &[1, 1, s, 2]).unwrap())
}

/// Reads a K/V pair back into tokens, checking shape and that V matches K row by row.
fn decode(k: &Array, v: &Array) -> Result<Vec<Tok>, TestCaseError> {
    let (ks, vs) = (k.shape().unwrap(), v.shape().unwrap());
    prop_assert_eq!(ks.len(), 4, "K shape {:?}", ks);
    prop_assert_eq!(&ks, &vs, "K and V shapes differ");
    prop_assert_eq!((ks[0], ks[1], ks[3]), (1, 1, 2), "K shape {:?}", ks);
    let kd = k.to_vec::<f32>().unwrap();
    let vd = v.to_vec::<f32>().unwrap();
    let mut out = Vec::with_capacity(kd.len() / 2);
    for (kr, vr) in kd.chunks_exact(2).zip(vd.chunks_exact(2)) {
        prop_assert!(kr[0] >= 0.0 && kr[0].fract() == 0.0, "K row {:?} is not a written row", kr);
        prop_assert!(kr[1] >= 1.0 && kr[1].fract() == 0.0, "K row {:?} is not a written row (zero padding?)", kr);
        prop_assert_eq!((vr[0], vr[1]), (kr[0] + 0.5, kr[1]), "V row does not belong to K row {:?}", kr);
        out.push(Tok { pos: kr[0] as u32, stamp: kr[1] as u32 });
    }
    Ok(out)
}

/// `got` is `want` cyclically rotated (ring order of a temporal sequence).
fn is_rotation(got: &[Tok], want: &[Tok]) -> bool {
    got.len() == want.len()
        && (want.is_empty() || (0..want.len()).any(|r| got[..] == [&want[r..], &want[..r]].concat()[..]))
}

/// What was expected of a trim.
#[derive(Debug)]
enum TrimKind {
    /// No rows change (n == 0).
    Nothing,
    /// The exact rollback right after a multi-token write: the rows are physically dropped.
    Rollback,
    /// mlx-lm's logical trim (before the ring wraps), or the full cache's.
    Logical,
    Refused(CacheError),
}

/// A cache plus the reference it must agree with.
struct Harness {
    cache: LayerCache,
    /// None for a full-attention cache.
    window: Option<usize>,
    committed: Vec<Tok>,
    /// Rows `retained()` must return (rotating: follows mlx-lm's layout; full: all).
    phys: usize,
    /// How many newest rows may still be rolled back exactly.
    budget: usize,
}

impl Harness {
    fn full() -> Harness {
        Harness { cache: LayerCache::Full(KvCache::new()), window: None, committed: Vec::new(), phys: 0, budget: 0 }
    }

    fn rotating(w: usize) -> Harness {
        Harness {
            cache: LayerCache::Rotating(RotatingKvCache::new(w)),
            window: Some(w),
            committed: Vec::new(),
            phys: 0,
            budget: 0,
        }
    }

    fn len(&self) -> usize {
        self.committed.len()
    }

    /// Appends `toks` (positions must continue the committed ones) and checks the fetch.
    fn append(&mut self, toks: &[Tok]) -> Result<Vec<Tok>, TestCaseError> {
        let before = self.len();
        let s = toks.len();
        for (i, t) in toks.iter().enumerate() {
            prop_assert_eq!(t.pos as usize, before + i, "test bug: positions must continue the history");
        }
        let mask = match self.window {
            Some(w) => sliding_mask(s, Some(&self.cache), w).unwrap(),
            None => full_mask(s),
        };
        let (k, v) = rows(toks);
        let (fk, fv) = self.cache.update_and_fetch(&k, &v).unwrap();
        let got = decode(&fk, &fv)?;
        self.committed.extend_from_slice(toks);
        let len = self.len();
        match self.window {
            None => {
                prop_assert_eq!(&got, &self.committed, "full cache fetch after appending {}", s);
                self.phys = len;
            }
            Some(w) if s == 1 => {
                let want = &self.committed[len - len.min(w)..];
                prop_assert!(
                    is_rotation(&got, want),
                    "single-token fetch (w={}, len={}) must be the last min(len, w) tokens in ring order:\n got  {:?}\n want {:?}",
                    w, len, got, want
                );
                self.phys = len.min(w);
                self.budget = 0;
            }
            Some(w) => {
                let kept = before.min(w - 1);
                let want = &self.committed[before - kept..];
                prop_assert_eq!(
                    &got[..], want,
                    "concat fetch of {} rows (w={}, old len={}) must be the last min(old, w-1) old rows then the new ones",
                    s, w, before
                );
                self.phys = kept + s;
                self.budget = s - 1;
            }
        }
        self.check_visibility(&mask, &got, before, s)?;
        self.check_state()?;
        Ok(got)
    }

    /// Each new query sees, through the mask, exactly the positions it may attend to.
    fn check_visibility(&self, mask: &AttnMask, buf: &[Tok], before: usize, s: usize) -> Result<(), TestCaseError> {
        let cols = buf.len();
        let rows: Option<Vec<bool>> = match mask {
            AttnMask::Array(a) => {
                prop_assert_eq!(
                    a.shape().unwrap(),
                    vec![s as i32, cols as i32],
                    "mask shape vs buffer of {} rows",
                    cols
                );
                Some(a.to_vec::<bool>().unwrap())
            }
            _ => None,
        };
        for i in 0..s {
            let q = before + i;
            let visible: BTreeSet<Tok> = (0..cols)
                .filter(|&j| match (mask, &rows) {
                    (AttnMask::None, _) => true,
                    // MLX's string causal is bottom-right aligned when qL < kL.
                    (AttnMask::Causal, _) => j + s <= cols + i,
                    (AttnMask::Array(_), Some(m)) => m[i * cols + j],
                    (AttnMask::Array(_), None) => unreachable!(),
                })
                .map(|j| buf[j])
                .collect();
            let lo = self.window.map_or(0, |w| (q + 1).saturating_sub(w));
            let want: BTreeSet<Tok> = self.committed[lo..=q].iter().copied().collect();
            prop_assert_eq!(
                &visible,
                &want,
                "query at position {} (window {:?}) with mask {:?} over buffer {:?}",
                q,
                self.window,
                mask,
                buf
            );
        }
        Ok(())
    }

    fn retained(&self) -> Result<Option<Vec<Tok>>, TestCaseError> {
        match self.cache.retained().unwrap() {
            None => Ok(None),
            Some((k, v)) => decode(&k, &v).map(Some),
        }
    }

    fn check_state(&self) -> Result<(), TestCaseError> {
        let len = self.len();
        prop_assert_eq!(self.cache.offset(), len, "offset vs committed length");
        let retained = self.retained()?;
        if len == 0 {
            prop_assert!(retained.is_none(), "an empty cache retains nothing, got {:?}", retained);
            return Ok(());
        }
        let Some(retained) = retained else {
            return Err(TestCaseError::fail(format!("cache of {len} tokens retains nothing")));
        };
        let want = &self.committed[len - self.phys..];
        prop_assert_eq!(
            &retained[..],
            want,
            "retained() must be the {} newest committed tokens in temporal order",
            self.phys
        );
        if let Some(w) = self.window {
            prop_assert!(self.phys >= len.min(w - 1), "retained {} < min(len {}, w-1)", self.phys, len);
            prop_assert!(self.phys >= len.min(w), "retained {} < min(len {}, w)", self.phys, len);
        }
        Ok(())
    }

    /// What a trim of `n` must do, from the reference state alone.
    fn expected_trim(&self, n: usize) -> TrimKind {
        let len = self.len();
        if n > len {
            return TrimKind::Refused(CacheError::TrimBeyondLen { requested: n, len });
        }
        match self.window {
            _ if n == 0 => TrimKind::Nothing,
            None => TrimKind::Logical,
            Some(_) if n <= self.budget => TrimKind::Rollback,
            Some(w) if len < w => TrimKind::Logical,
            Some(w) => TrimKind::Refused(CacheError::TrimAfterWrap {
                requested: n,
                offset: len,
                window: w,
                last_write: self.budget + 1,
                rollback_left: self.budget,
            }),
        }
    }

    /// Trims `n` through `LayerCache::trim`, checking `check_trim` agrees; returns whether it
    /// was applied.
    fn trim(&mut self, n: usize) -> Result<bool, TestCaseError> {
        let kind = self.expected_trim(n);
        let before_retained = self.retained()?;
        let before_offset = self.cache.offset();
        let checked = self.cache.check_trim(n);
        let res = self.cache.trim(n);
        match kind {
            TrimKind::Refused(want) => {
                let same = |e: &CacheError| match (e, &want) {
                    (
                        CacheError::TrimAfterWrap { requested, offset, window, .. },
                        CacheError::TrimAfterWrap { requested: r, offset: o, window: w, .. },
                    ) => (requested, offset, window) == (r, o, w),
                    (a, b) => a == b,
                };
                match &checked {
                    Err(e) => prop_assert!(same(e), "check_trim({}) refused with {:?}, expected {:?}", n, e, want),
                    Ok(()) => return Err(TestCaseError::fail(format!("check_trim({n}) allowed, expected {want:?}"))),
                }
                match &res {
                    Err(Error::Cache(e)) => {
                        prop_assert!(same(e), "trim({}) refused with {:?}, expected {:?}", n, e, want)
                    }
                    other => return Err(TestCaseError::fail(format!("trim({n}) gave {other:?}, expected {want:?}"))),
                }
                let msg = res.unwrap_err().to_string();
                prop_assert!(msg.contains(&n.to_string()), "refusal message {:?} names the request", msg);
                prop_assert_eq!(self.cache.offset(), before_offset, "a refused trim changed the offset");
                prop_assert_eq!(self.retained()?, before_retained, "a refused trim changed the retained rows");
                self.check_state()?;
                Ok(false)
            }
            kind => {
                prop_assert!(checked.is_ok(), "check_trim({}) refused ({:?}), expected {:?}", n, checked, kind);
                prop_assert!(res.is_ok(), "trim({}) failed ({:?}), expected {:?}", n, res, kind);
                let len = self.len();
                self.committed.truncate(len - n);
                match kind {
                    TrimKind::Nothing => {}
                    TrimKind::Rollback => {
                        self.phys -= n;
                        self.budget -= n;
                    }
                    TrimKind::Logical => {
                        // Only legal before the ring wraps, when every token is retained.
                        prop_assert_eq!(self.phys, len, "reference: a logical trim with evicted rows");
                        self.phys = len - n;
                        self.budget = 0;
                    }
                    TrimKind::Refused(_) => unreachable!(),
                }
                self.check_state()?;
                Ok(true)
            }
        }
    }
}

/// Hands out fresh tokens continuing a history.
struct Stamps(u32);

impl Stamps {
    fn toks(&mut self, from: usize, n: usize) -> Vec<Tok> {
        (0..n)
            .map(|i| {
                self.0 += 1;
                Tok { pos: (from + i) as u32, stamp: self.0 }
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Write S rows (S == 1: in-place path; S > 1: concat path).
    Append(usize),
    /// Trim n (anything from 0 to past the length).
    Trim(usize),
    /// A verify batch: write S rows, then roll back k ≤ S − 1 of them.
    Verify(usize, usize),
    /// Trim one more than the length.
    TrimPastEnd,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=12).prop_map(Op::Append),
        3 => Just(Op::Append(1)),
        3 => (0usize..=13).prop_map(Op::Trim),
        3 => (2usize..=12).prop_flat_map(|s| (Just(s), 0..s)).prop_map(|(s, k)| Op::Verify(s, k)),
        1 => Just(Op::TrimPastEnd),
    ]
}

fn run(h: &mut Harness, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut stamps = Stamps(0);
    h.check_state()?;
    for op in ops {
        match *op {
            Op::Append(s) => {
                let t = stamps.toks(h.len(), s);
                h.append(&t)?;
            }
            Op::Trim(n) => {
                h.trim(n)?;
            }
            Op::Verify(s, k) => {
                let t = stamps.toks(h.len(), s);
                h.append(&t)?;
                let applied = h.trim(k)?;
                prop_assert!(applied, "rollback of {} after a write of {} refused", k, s);
            }
            Op::TrimPastEnd => {
                let applied = h.trim(h.len() + 1)?;
                prop_assert!(!applied);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn full_cache_matches_reference(ops in prop::collection::vec(op(), 0..=40)) {
        run(&mut Harness::full(), &ops)?;
    }

    #[test]
    fn rotating_cache_matches_reference(w in 2usize..=10, ops in prop::collection::vec(op(), 0..=40)) {
        run(&mut Harness::rotating(w), &ops)?;
    }

    /// Speculative decoding rounds: a verify write of S rows, an over-long trim that must be
    /// refused once the ring has wrapped, the rollback of k ≤ S − 1 rows, then a next write.
    /// A twin cache that only ever saw the accepted rows (written as one batch: concat if ≥ 2,
    /// in place if 1) must show the same content after that next write (as a sequence for a
    /// concat write, as a set for an in-place one, whose ring order depends on history).
    #[test]
    fn rollback_is_indistinguishable_from_never_writing(
        w in 2usize..=10,
        prefix in prop::collection::vec(prop_oneof![1usize..=12, Just(1usize)], 0..=8),
        rounds in prop::collection::vec(
            (2usize..=8).prop_flat_map(|s| (Just(s), 0..s, prop_oneof![Just(1usize), 1usize..=12])),
            1..=8,
        ),
    ) {
        let mut main = Harness::rotating(w);
        let mut twin = Harness::rotating(w);
        let mut stamps = Stamps(0);
        for &s in &prefix {
            let t = stamps.toks(main.len(), s);
            main.append(&t)?;
            twin.append(&t)?;
        }
        for &(s, k, next) in &rounds {
            let t = stamps.toks(main.len(), s);
            main.append(&t)?;
            if main.len() >= w {
                // Wrapped (mlx-lm would refuse every trim): only the last write may go, minus one.
                prop_assert!(!main.trim(s)?, "trim({}) after a wrapped write of {} allowed", s, s);
            }
            prop_assert!(main.cache.check_trim(k).is_ok(), "rollback {} of {} refused at offset {}", k, s, main.len());
            prop_assert!(main.trim(k)?);
            twin.append(&t[..s - k])?;
            prop_assert_eq!(&main.committed, &twin.committed);
            let n = stamps.toks(main.len(), next);
            let a = main.append(&n)?;
            let b = twin.append(&n)?;
            if next == 1 {
                let (sa, sb): (BTreeSet<Tok>, BTreeSet<Tok>) = (a.iter().copied().collect(), b.iter().copied().collect());
                prop_assert_eq!(sa, sb, "in-place write after rollback: visible set differs from the twin");
            } else {
                prop_assert_eq!(a, b, "concat write after rollback: buffer differs from the twin");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Verification's stepwise writes hand every row exactly what a token-at-a-time (in-place)
    /// cache fetches at that position — the same rows in the same ring order — for any window,
    /// prefill chunking and rollbacks; a twin decodes only the kept rows one by one.
    #[test]
    fn stepwise_views_are_what_token_at_a_time_decoding_fetches(
        w in 2usize..=10,
        full in any::<bool>(),
        prefill in prop::collection::vec(1usize..=12, 0..=4),
        rounds in prop::collection::vec((1usize..=8).prop_flat_map(|s| (Just(s), 0..s)), 1..=12),
    ) {
        let fresh = || if full { LayerCache::Full(KvCache::new()) } else { LayerCache::Rotating(RotatingKvCache::new(w)) };
        let (mut spec, mut twin) = (fresh(), fresh());
        let mut stamps = Stamps(0);
        let mut len = 0;
        for &s in &prefill {
            let (k, v) = rows(&stamps.toks(len, s));
            spec.update_and_fetch(&k, &v).unwrap();
            twin.update_and_fetch(&k, &v).unwrap();
            len += s;
        }
        for &(s, rejected) in &rounds {
            let toks = stamps.toks(len, s);
            let (k, v) = rows(&toks);
            let views = spec.update_and_fetch_stepwise(&k, &v).unwrap();
            prop_assert_eq!(views.len(), s);
            let mut probe = twin.clone();
            for (i, t) in toks.iter().enumerate() {
                let (tk, tv) = rows(&[*t]);
                let (fk, fv) = probe.update_and_fetch(&tk, &tv).unwrap();
                let want = decode(&fk, &fv)?;
                let got = decode(&views[i].0, &views[i].1)?;
                prop_assert_eq!(&got, &want, "row {} (position {}) of a stepwise write of {}", i, len + i, s);
            }
            spec.trim(rejected).unwrap();
            for t in &toks[..s - rejected] {
                let (tk, tv) = rows(&[*t]);
                twin.update_and_fetch(&tk, &tv).unwrap();
            }
            len += s - rejected;
            prop_assert_eq!(spec.offset(), len);
        }
    }
}

/// The tiny config A model (its checkpoint is written once per test binary).
fn model_a() -> Model {
    Model::load(common::tiny_a()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Verify rounds through the model: a window of the pending token plus d drafts scored by
    /// `forward_stepwise`, a accepted, the rest rolled back. The next token, scored stepwise on
    /// that cache, must get logits bit-identical to a one-token decode step on a twin that
    /// decoded only the kept tokens one at a time (config A has sliding window 8, so the rounds
    /// wrap the rings).
    #[test]
    fn rollback_through_the_model_is_bit_identical_to_never_writing(
        rounds in prop::collection::vec((1usize..=7, 0usize..=7, 0u32..500), 1..10),
        plen in 1usize..=12,
    ) {
        let m = &model_a();
        let p: Vec<u32> = (0..plen as u32).map(|i| 3 + (i * 37) % 500).collect();
        let (mut spec, mut twin) = (m.new_cache(), m.new_cache());
        m.forward(&ids_array(&p).unwrap(), Some(&mut spec)).unwrap();
        m.forward(&ids_array(&p).unwrap(), Some(&mut twin)).unwrap();
        let bytes = |a: Array| a.to_bytes().unwrap();
        for (d, a, salt) in rounds {
            let a = a.min(d);
            let window: Vec<u32> = (0..=d as u32).map(|i| 4 + (salt + i * 29) % 500).collect();
            m.forward_stepwise(&ids_array(&window).unwrap(), &mut spec, None).unwrap();
            spec.trim(d - a).unwrap();
            for &t in &window[..=a] {
                m.forward(&ids_array(&[t]).unwrap(), Some(&mut twin)).unwrap();
            }
            prop_assert_eq!(spec.offset(), twin.offset());
            // The next token as the next verify round scores it (stepwise; a plain forward on a
            // cache written stepwise reads its ring in another order and rounds differently),
            // against a one-token decode step on the twin.
            let probe = ids_array(&[7]).unwrap();
            let next = m.forward_stepwise(&probe, &mut spec.clone(), None).unwrap();
            let ls = bytes(m.logits_from_hidden(&next.hidden).unwrap());
            let lt = bytes(m.logits(&probe, Some(&mut twin.clone())).unwrap());
            prop_assert!(ls == lt, "rolled-back vs twin logits differ at offset {}", spec.offset());
        }
    }
}

#[test]
fn a_kept_rejected_token_breaks_bit_equality() {
    // The property above has teeth: one stale row changes the next token's logits.
    let m = &model_a();
    let mut good = m.new_cache();
    m.forward(&ids_array(&[3, 40, 77, 114, 151, 188]).unwrap(), Some(&mut good)).unwrap();
    let mut bad = good.clone();
    m.forward_stepwise(&ids_array(&[200, 100]).unwrap(), &mut bad, None).unwrap();
    m.forward(&ids_array(&[200]).unwrap(), Some(&mut good)).unwrap();
    let probe = ids_array(&[7]).unwrap();
    let a = m.logits(&probe, Some(&mut good)).unwrap().to_bytes().unwrap();
    let b = m.logits_from_hidden(&m.forward_stepwise(&probe, &mut bad, None).unwrap().hidden).unwrap();
    let b = b.to_bytes().unwrap();
    assert_ne!(a, b);
}

// Hand-written cases pinning the scenarios the properties are about (and the ones a random
// search may reach rarely).

fn toks(from: usize, n: usize, stamps: &mut Stamps) -> Vec<Tok> {
    stamps.toks(from, n)
}

#[test]
fn rollback_after_wrap_then_single_token() {
    // w = 4: prefill 6 (wrapped), verify 4, reject 3, then decode one token.
    let mut h = Harness::rotating(4);
    let mut st = Stamps(0);
    let run = |h: &mut Harness, st: &mut Stamps| -> Result<(), TestCaseError> {
        h.append(&toks(0, 6, st))?;
        h.append(&toks(6, 4, st))?;
        prop_assert!(!h.trim(4)?); // more than S − 1
        prop_assert!(h.trim(3)?);
        prop_assert_eq!(h.cache.offset(), 7);
        let got = h.append(&toks(7, 1, st))?;
        let pos: BTreeSet<u32> = got.iter().map(|t| t.pos).collect();
        prop_assert_eq!(pos, (4..8).collect::<BTreeSet<u32>>());
        prop_assert!(!h.trim(1)?); // after a single-token write of a wrapped ring
        Ok(())
    };
    run(&mut h, &mut st).unwrap();
}

#[test]
fn rollback_in_two_steps_consumes_the_budget() {
    let mut h = Harness::rotating(3);
    let mut st = Stamps(0);
    let run = |h: &mut Harness, st: &mut Stamps| -> Result<(), TestCaseError> {
        h.append(&toks(0, 5, st))?;
        h.append(&toks(5, 6, st))?; // budget 5
        prop_assert!(h.trim(2)?);
        prop_assert!(h.trim(3)?);
        prop_assert!(!h.trim(1)?); // the write's first row must stay
        let got = h.append(&toks(6, 3, st))?;
        prop_assert_eq!(got.iter().map(|t| t.pos).collect::<Vec<_>>(), vec![4, 5, 6, 7, 8]);
        Ok(())
    };
    run(&mut h, &mut st).unwrap();
}

#[test]
fn refused_trims_name_the_request() {
    let mut c = LayerCache::Rotating(RotatingKvCache::new(2));
    let (k, v) = rows(&Stamps(0).toks(0, 3));
    c.update_and_fetch(&k, &v).unwrap();
    let e = c.trim(3).unwrap_err();
    assert!(matches!(e, Error::Cache(CacheError::TrimAfterWrap { requested: 3, offset: 3, window: 2, .. })), "{e:?}");
    let e = c.trim(4).unwrap_err();
    assert!(matches!(e, Error::Cache(CacheError::TrimBeyondLen { requested: 4, len: 3 })), "{e:?}");
    assert_eq!(e.to_string(), "cache: cannot trim 4 tokens from a cache holding 3");
    assert_eq!(c.offset(), 3);
    let mut f = LayerCache::Full(KvCache::new());
    assert!(matches!(f.trim(1).unwrap_err(), Error::Cache(CacheError::TrimBeyondLen { requested: 1, len: 0 })));
    f.trim(0).unwrap();
}

#[test]
fn full_cache_across_the_256_row_step() {
    let mut h = Harness::full();
    let mut st = Stamps(0);
    let run = |h: &mut Harness, st: &mut Stamps| -> Result<(), TestCaseError> {
        h.append(&toks(0, 250, st))?;
        for i in 250..258 {
            h.append(&toks(i, 1, st))?;
        }
        prop_assert!(h.trim(10)?);
        h.append(&toks(248, 12, st))?;
        h.append(&toks(260, 300, st))?;
        prop_assert!(h.trim(560)?);
        h.append(&toks(0, 2, st))?;
        Ok(())
    };
    run(&mut h, &mut st).unwrap();
}

#[test]
fn malformed_writes_are_refused_and_change_nothing() {
    for mut c in [LayerCache::Full(KvCache::new()), LayerCache::Rotating(RotatingKvCache::new(4))] {
        let (k, v) = rows(&Stamps(0).toks(0, 3));
        c.update_and_fetch(&k, &v).unwrap();
        let before = c.retained().unwrap().map(|(k, v)| (k.to_bytes().unwrap(), v.to_bytes().unwrap()));
        let wide = Array::zeros(&[1, 1, 1, 3], mlx_core::Dtype::F32).unwrap(); // D 3 vs the cached 2
        let flat = Array::zeros(&[1, 2], mlx_core::Dtype::F32).unwrap();
        for (k, v) in [(&wide, &wide), (&flat, &flat)] {
            let e = c.update_and_fetch(k, v).unwrap_err().to_string();
            assert!(e.contains("cache write"), "{e}");
            assert!(c.update_and_fetch_stepwise(k, v).is_err());
        }
        assert_eq!(c.offset(), 3, "a refused write moved the offset");
        let after = c.retained().unwrap().map(|(k, v)| (k.to_bytes().unwrap(), v.to_bytes().unwrap()));
        assert_eq!(before, after, "a refused write changed the rows");
    }
}

/// Row `i`'s keys and values read from `(k, v)` over `ranges`, in order.
fn read_ranges(k: &Array, v: &Array, ranges: &[std::ops::Range<usize>]) -> Result<Vec<Tok>, TestCaseError> {
    let mut out = Vec::new();
    for r in ranges {
        let (ks, vs) = (
            k.slice_axis(2, r.start as i32, r.end as i32).unwrap(),
            v.slice_axis(2, r.start as i32, r.end as i32).unwrap(),
        );
        out.extend(decode(&ks, &vs)?);
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, failure_persistence: None, ..ProptestConfig::default() })]

    /// A planned stepwise write ([`LayerCache::begin_stepwise`], carried out for two sessions at
    /// once by `mlx_core::row_cache::attend_and_write`) leaves each cache exactly as the composed
    /// write does (`update_and_fetch_stepwise_pieces`: same offset, same retained rows, same
    /// trims allowed after it), reads every row's keys in the same order, and attends with the
    /// same bits, whether the buffers are rewritten in place or copied (a held clone forces the
    /// copy).
    #[test]
    fn planned_stepwise_writes_match_the_composed_ones(
        w in 2usize..=10,
        full in prop::collection::vec(any::<bool>(), 2),
        prefill in prop::collection::vec(1usize..=12, 1..=3),
        rounds in prop::collection::vec(
            ((1usize..=6).prop_flat_map(|s| (Just(s), 0..s)), (1usize..=6).prop_flat_map(|s| (Just(s), 0..s)), any::<bool>()),
            1..=10,
        ),
    ) {
        let fresh = |f: bool| if f { LayerCache::Full(KvCache::new()) } else { LayerCache::Rotating(RotatingKvCache::new(w)) };
        // Session s: a composed cache and a planned one.
        let mut composed = [fresh(full[0]), fresh(full[1])];
        let mut planned = [fresh(full[0]), fresh(full[1])];
        let mut stamps = Stamps(0);
        let mut lens = [0usize; 2];
        for s in 0..2 {
            for &n in &prefill {
                let (k, v) = rows(&stamps.toks(lens[s], n));
                composed[s].update_and_fetch(&k, &v).unwrap();
                planned[s].update_and_fetch(&k, &v).unwrap();
                lens[s] += n;
            }
        }
        for (round, &((s0, r0), (s1, r1), hold)) in rounds.iter().enumerate() {
            let sizes = [s0, s1];
            let toks: Vec<Vec<Tok>> = (0..2).map(|s| stamps.toks(lens[s], sizes[s])).collect();
            let all: Vec<Tok> = toks.concat();
            let (k, v) = rows(&all);
            let r = all.len() as i32;
            // Two query heads over the one key head; small values keep the softmax finite.
            let qd: Vec<f32> = (0..2 * r * 2).map(|i| ((i * 7 + round as i32) % 11) as f32 * 0.01 - 0.05).collect();
            let q = Array::from_slice(&qd, &[1, 2, r, 2]).unwrap();
            let mut writes = Vec::new();
            let mut reads = Vec::new();
            let mut held = Vec::new();
            for s in 0..2 {
                let plan = planned[s].begin_stepwise(&k, &v, sizes[s]).unwrap();
                let plan = plan.ok_or_else(|| TestCaseError::fail("a written cache planned nothing"))?;
                if hold {
                    held.push(plan.write.keys.clone());
                }
                writes.push(plan.write);
                reads.extend(plan.reads);
            }
            let (o, buffers) = mlx_core::row_cache::attend_and_write(&q, &k, &v, writes, &reads, 1.0).unwrap();
            for (s, (kb, vb)) in buffers.iter().enumerate() {
                planned[s].finish_stepwise(kb.clone(), vb.clone());
            }
            // The composed write of each session's rows, and attention over its pieces.
            let mut pieces = Vec::new();
            let mut start = 0;
            for s in 0..2 {
                let (ks, vs) = rows(&toks[s]);
                pieces.extend(composed[s].update_and_fetch_stepwise_pieces(&ks, &vs).unwrap());
                for (i, p) in pieces[start..].iter().enumerate() {
                    let (pk, pv) = gemma4::cache::join_pieces(p.clone()).unwrap();
                    let got = read_ranges(&buffers[s].0, &buffers[s].1, &reads[start + i])?;
                    prop_assert_eq!(got, decode(&pk, &pv)?, "session {} row {} of round {}", s, i, round);
                }
                start += sizes[s];
            }
            let want = mlx_core::blas::row_attention_pieces(&q, &pieces, 1.0).unwrap();
            prop_assert_eq!(o.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap(), "attention, round {}", round);
            drop(held);
            let rejected = [r0, r1];
            for s in 0..2 {
                prop_assert_eq!(planned[s].offset(), composed[s].offset());
                let (a, b) = (planned[s].retained().unwrap().unwrap(), composed[s].retained().unwrap().unwrap());
                prop_assert_eq!(decode(&a.0, &a.1)?, decode(&b.0, &b.1)?, "retained rows of session {}", s);
                // One more than the rollback may be refused by both or by neither.
                let over = rejected[s] + 1;
                prop_assert_eq!(planned[s].check_trim(over).is_ok(), composed[s].check_trim(over).is_ok());
                planned[s].trim(rejected[s]).unwrap();
                composed[s].trim(rejected[s]).unwrap();
                lens[s] += sizes[s] - rejected[s];
            }
        }
    }
}

/// A planned write rewrites the buffers of a cache that holds them alone in place (a full
/// cache's rows go at its offset; the buffer's address stays), and copies them when anything
/// else holds them (a clone of the cache), leaving that holder's rows as they were.
#[test]
fn planned_writes_rewrite_buffers_held_alone_in_place() {
    let mut cache = LayerCache::Full(KvCache::new());
    let mut stamps = Stamps(0);
    let (k, v) = rows(&stamps.toks(0, 3));
    cache.update_and_fetch(&k, &v).unwrap();
    mlx_core::eval(&cache.state()).unwrap();
    let q = Array::from_slice(&[0.01f32, -0.02], &[1, 1, 1, 2]).unwrap();
    for (round, hold) in [false, false, true, false].into_iter().enumerate() {
        let len = cache.offset();
        let (k, v) = rows(&stamps.toks(len, 1));
        let held = hold.then(|| cache.clone());
        let plan = cache.begin_stepwise(&k, &v, 1).unwrap().unwrap();
        let before = [plan.write.keys.buffer_address(), plan.write.values.buffer_address()];
        assert!(before.iter().all(Option::is_some), "round {round}: the buffers are evaluated");
        let (o, buffers) =
            mlx_core::row_cache::attend_and_write(&q, &k, &v, vec![plan.write], &plan.reads, 1.0).unwrap();
        mlx_core::eval(&[&o, &buffers[0].0, &buffers[0].1]).unwrap();
        let after = [buffers[0].0.buffer_address(), buffers[0].1.buffer_address()];
        if hold {
            assert!(
                before != after && after.iter().all(Option::is_some),
                "round {round}: a held buffer must be copied"
            );
            let (hk, hv) = held.as_ref().unwrap().retained().unwrap().unwrap();
            assert_eq!(decode(&hk, &hv).unwrap().len(), len, "round {round}: the holder's rows stay");
        } else {
            assert_eq!(before, after, "round {round}: a buffer held alone is rewritten in place");
        }
        let (kb, vb) = buffers.into_iter().next().unwrap();
        cache.finish_stepwise(kb, vb);
        drop(held);
        assert_eq!(cache.offset(), len + 1);
    }
}
