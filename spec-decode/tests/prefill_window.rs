//! A tap window: the prefill taps only the chunks that hold the last `window` committed rows,
//! gives the same cache and the same rows as tapping everything, and prefix states that lack
//! the rows a prompt needs are not resumed from.

use std::path::PathBuf;
use std::sync::OnceLock;

use gemma4::checkpoint::write_random_checkpoint;
use gemma4::config::tiny_config_a;
use gemma4::{Model, TapSet};
use mlx_core::Dtype;
use spec_decode::{prefill, prefill_from, Prefilled};

fn model() -> Model {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = gemma4::testing::scratch("prefill-window-target");
        write_random_checkpoint(&dir, &tiny_config_a(), 11, Dtype::Bf16, 1, true).unwrap()
    });
    Model::load(dir).unwrap()
}

fn cache_bytes(p: &Prefilled) -> Vec<Vec<u8>> {
    p.cache().eval().unwrap();
    (0..p.cache().len())
        .flat_map(|i| {
            p.cache().layer(i).unwrap().state().into_iter().map(|a| a.to_bytes().unwrap()).collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn a_windowed_prefill_keeps_the_last_rows_and_the_cache() {
    let m = model();
    let all = TapSet::layers(&[1, 3]);
    let windowed = all.clone().with_window(Some(5));
    let prompt: Vec<u32> = (0..21).map(|i| 4 + (i * 37 + 11) % 500).collect();
    let mut full = prefill(&m, &all, &prompt, 4).unwrap();
    let mut win = prefill(&m, &windowed, &prompt, 4).unwrap();
    assert_eq!(cache_bytes(&win), cache_bytes(&full), "untapped chunks write the same cache");
    let (full_rows, win_rows) = (full.take_ctx().unwrap(), win.take_ctx().unwrap());
    assert_eq!(full_rows.dim(1).unwrap(), 20);
    assert_eq!(win_rows.dim(1).unwrap(), 5, "the last 5 of 20 committed rows");
    assert_eq!(win_rows.to_bytes().unwrap(), full_rows.slice_axis(1, 15, 20).unwrap().to_bytes().unwrap());

    // A window longer than the prompt taps everything.
    let mut wide = prefill(&m, &all.clone().with_window(Some(64)), &prompt, 4).unwrap();
    assert_eq!(wide.take_ctx().unwrap().to_bytes().unwrap(), full_rows.to_bytes().unwrap());
}

#[test]
fn prefix_states_without_the_needed_rows_are_not_resumed() {
    let m = model();
    let taps = TapSet::layers(&[1, 3]).with_window(Some(3));
    // A 30-token prompt commits rows 0..=28 and the window needs rows 26..=28, so the chunks
    // of 4 before row 24 run untapped and the states after 4, 8, …, 24 tokens hold no rows.
    let long: Vec<u32> = (0..30).map(|i| 4 + (i * 53 + 7) % 500).collect();
    let mut states = Vec::new();
    prefill_from(&m, &taps, &long, 4, None, |s| states.push(s)).unwrap();
    let at = |n: usize| states.iter().find(|s| s.tokens().len() == n).unwrap();
    // A 15-token prompt with the same head commits rows 0..=13 and needs 11..=13: the state
    // after 8 tokens may be resumed (every needed row comes later), the state after 12 may not
    // (it lacks row 11).
    let short = &long[..15];
    assert!(at(8).resumable_for(&taps, short, 4));
    assert!(!at(12).resumable_for(&taps, short, 4));
    // Resuming where allowed gives the from-scratch result bit for bit.
    let mut resumed = prefill_from(&m, &taps, short, 4, Some(at(8)), |_| {}).unwrap();
    let mut scratch = prefill(&m, &taps, short, 4).unwrap();
    assert_eq!(cache_bytes(&resumed), cache_bytes(&scratch));
    assert_eq!(resumed.take_ctx().unwrap().to_bytes().unwrap(), scratch.take_ctx().unwrap().to_bytes().unwrap());
    // A state refused for the shorter prompt is fine for the prompt it was made for.
    assert!(at(24).resumable_for(&taps, &long, 4));
}
