//! Regenerated-data shards and the anchor sampler: alignment (context strictly before the
//! anchor, p^t rows g..g+γ−1), padding, and refusals of data that does not fit.

use mlx_core::{Array, Dtype};
use train::sampler::{anchors_in, sample_batch};
use train::shards::{list_shards, read_shard, write_shard, Sequence, TargetId};
use train::SplitMix64;

const H: usize = 4;
const TAPS: [usize; 2] = [1, 3]; // the last is the final norm of a 3-layer target

fn target() -> TargetId {
    TargetId { hidden_size: H, vocab_size: 1000, num_layers: 3 }
}

/// A sequence whose row i holds the value `base + i` in every feature, so rows identify
/// themselves after sampling.
fn seq(base: usize, len: usize, resp: usize) -> Sequence {
    let ids: Vec<u32> = (0..len).map(|i| (base + i) as u32).collect();
    let vals: Vec<f32> = (0..len).flat_map(|i| std::iter::repeat_n((base + i) as f32, TAPS.len() * H)).collect();
    Sequence { ids, resp_start: resp, rows: Array::from_slice(&vals, &[len as i32, (TAPS.len() * H) as i32]).unwrap() }
}

fn scratch(name: &str) -> std::path::PathBuf {
    gemma4::testing::scratch(&format!("train-data-{name}"))
}

#[test]
fn shards_round_trip_and_anchors_are_aligned() {
    let dir = scratch("align");
    // Sequence A: positions 0..20 (prompt 0..5), sequence B: 100..130 (prompt 100..110).
    write_shard(&dir, 0, &target(), &TAPS, &[seq(0, 20, 5), seq(100, 30, 10)]).unwrap();
    let shards = list_shards(&dir, Some((&target(), &TAPS))).unwrap();
    let shard = read_shard(&shards[0]).unwrap();
    assert_eq!(shard.seqs, vec![(0, 20, 5), (20, 30, 10)]);
    let gamma = 3;
    // Anchors from the last prompt token to len − γ − 1: A 4..17 (13), B 9..27 (18).
    assert_eq!(anchors_in(&shard, gamma), 13 + 18);
    let mut rng = SplitMix64::new(1);
    let (a, max_ctx) = (64, 6);
    let b = sample_batch(&shard, a, gamma, max_ctx, &mut rng).unwrap();
    let anchors = b.anchors.to_vec::<u32>().unwrap();
    let block = b.block.to_vec::<u32>().unwrap();
    let ctx = b.ctx_rows.astype(Dtype::F32).unwrap().to_f32_vec().unwrap();
    let mask = b.ctx_mask.astype(Dtype::U32).unwrap().to_vec::<u32>().unwrap();
    let tgt = b.target_hidden.astype(Dtype::F32).unwrap().to_f32_vec().unwrap();
    let width = TAPS.len() * H;
    let mut seen_prompt_anchor = false;
    for i in 0..a {
        let g = anchors[i] as usize; // ids are positions + base
        let (base, resp) = if g >= 100 { (100, 10) } else { (0, 5) };
        assert!(g + 1 >= base + resp, "anchor {g} lies before the response");
        seen_prompt_anchor |= g + 1 == base + resp;
        assert_eq!(&block[i * gamma..(i + 1) * gamma], &[g as u32 + 1, g as u32 + 2, g as u32 + 3]);
        // Context: the rows strictly before g within the sequence, the most recent max_ctx.
        let n_ctx = (g - base).min(max_ctx);
        for c in 0..max_ctx {
            let real = c >= max_ctx - n_ctx;
            assert_eq!(mask[i * max_ctx + c] == 1, real);
            if real {
                let row = ctx[(i * max_ctx + c) * width];
                assert_eq!(row as usize + max_ctx - c, g, "context row of anchor {g}");
            }
        }
        // p^t rows: g..g+γ−1, the last H features.
        for k in 0..gamma {
            assert_eq!(tgt[(i * gamma + k) * H] as usize, g + k);
        }
    }
    assert!(seen_prompt_anchor, "the last prompt token anchors the first response block");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn data_that_does_not_fit_is_refused() {
    let dir = scratch("refuse");
    write_shard(&dir, 0, &target(), &TAPS, &[seq(0, 12, 4)]).unwrap();
    // Another tap set (or target) in the same directory.
    write_shard(&dir, 1, &target(), &[0, 3], &[seq(0, 12, 4)]).unwrap();
    let e = list_shards(&dir, None).unwrap_err().to_string();
    assert!(e.contains("shard_00001") && e.contains("taps [0, 3]"), "{e}");
    let other = TargetId { num_layers: 4, ..target() };
    let e = list_shards(&dir, Some((&other, &TAPS))).unwrap_err().to_string();
    assert!(e.contains("shard_00000") && e.contains("3 layers") && e.contains("4 layers"), "{e}");
    assert!(!e.contains("TargetId {"), "in words, not Rust's debug form: {e}");
    // A block longer than any response allows.
    let shard = read_shard(&dir.join("shard_00000")).unwrap();
    let e = sample_batch(&shard, 2, 20, 4, &mut SplitMix64::new(0)).unwrap_err().to_string();
    assert!(e.contains("γ too long"), "{e}");
    // A corrupt data file.
    std::fs::write(dir.join("shard_00000/data.safetensors"), b"not a safetensors file").unwrap();
    assert!(read_shard(&dir.join("shard_00000")).is_err());
    // An existing shard is never overwritten.
    assert!(write_shard(&dir, 1, &target(), &TAPS, &[seq(0, 12, 4)]).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_rng_is_uniform_enough_and_resumable() {
    let mut r = SplitMix64::new(42);
    let mut counts = [0usize; 5];
    for _ in 0..5000 {
        counts[r.below(5) as usize] += 1;
    }
    assert!(counts.iter().all(|&c| (900..1100).contains(&c)), "{counts:?}");
    let mut copy = SplitMix64::new(r.state);
    assert_eq!(copy.next_u64(), r.next_u64());
}
