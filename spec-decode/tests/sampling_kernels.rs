//! mlx-core's sampling kernels, which the loop uses for f32 rows on the CPU, against the
//! composed MLX pipeline that plain decoding's sampler follows: the same support, probabilities
//! within f32 rounding, and the very same draws.

use gemma4::sampling::SamplerConfig;
use mlx_core::random;
use mlx_core::{Array, Dtype};
use spec_decode::probs::{
    composed_probabilities, composed_sample_rows, probabilities, sample_residual_rows, sample_rows,
};
use spec_decode::verify::residual_weights;

fn kernels_on() {
    assert!(
        mlx_core::blas::row_kernels_active().unwrap(),
        "these tests compare the row kernels with the composed ops; run them with the row kernels on (unset MLX_CORE_ROW_LINEAR)"
    );
}

fn logits(rows: i32, v: i32, seed: u64) -> Array {
    random::normal(&[rows, v], Dtype::F32, 0.0, 3.0, &random::key(seed).unwrap()).unwrap()
}

#[test]
fn probabilities_match_the_composed_pipeline() {
    kernels_on();
    let cfg = |temperature: f64, top_p: f64, min_p: f64, min_tokens_to_keep: usize, top_k: usize| SamplerConfig {
        temperature,
        top_p,
        min_p,
        min_tokens_to_keep,
        top_k,
        logit_bias: vec![],
    };
    let configs = [
        cfg(1.0, 0.0, 0.0, 1, 0),
        cfg(0.7, 0.0, 0.0, 1, 0),
        cfg(0.7, 0.95, 0.0, 1, 0),
        cfg(1.0, 0.5, 0.0, 1, 0),
        cfg(1.0, 0.999, 0.0, 1, 0),
        cfg(1.0, 0.0, 0.05, 1, 0),
        cfg(0.8, 0.0, 0.2, 5, 0),
        cfg(1.0, 0.0, 0.0, 1, 40),
        cfg(1.3, 0.9, 0.02, 1, 20),
    ];
    for (v, seed) in [(7, 1), (300, 2), (4096, 3)] {
        let l = logits(5, v, seed);
        for c in &configs {
            if c.top_k >= v as usize {
                continue;
            }
            let got = probabilities(&l, c).unwrap().to_f32_vec().unwrap();
            let want = composed_probabilities(&l, c).unwrap().to_f32_vec().unwrap();
            for (r, (g, w)) in got.chunks(v as usize).zip(want.chunks(v as usize)).enumerate() {
                // A token whose cumulative mass lies within rounding of the top-p cut may be kept
                // by one pipeline and not the other (their sums round differently): at most one
                // such token per row, of negligible probability.
                let odd: Vec<usize> = (0..v as usize).filter(|&i| (g[i] > 0.0) != (w[i] > 0.0)).collect();
                let odd_mass: f32 = odd.iter().map(|&i| g[i].max(w[i])).sum();
                assert!(odd.len() <= 1 && odd_mass < 1e-5, "V {v} {c:?} row {r}: supports differ at {odd:?}");
                for i in (0..v as usize).filter(|i| !odd.contains(i)) {
                    let tol = 2e-6 + 2e-5 * w[i] + odd_mass;
                    assert!((g[i] - w[i]).abs() <= tol, "V {v} {c:?} row {r} token {i}: {} vs {}", g[i], w[i]);
                }
                let s: f64 = g.iter().map(|&x| f64::from(x)).sum();
                assert!((s - 1.0).abs() < 1e-5, "V {v} {c:?}: a row sums to {s}");
            }
        }
    }
}

#[test]
fn draws_equal_the_composed_draws() {
    kernels_on();
    let (rows, v) = (64, 500);
    // Weights with many zeros, not normalised; a grid of uniforms including ones just under 1.
    let w = logits(rows, v, 7).exp().unwrap();
    let zero = random::uniform(0.0, 1.0, &[rows, v], Dtype::F32, &random::key(8).unwrap()).unwrap();
    let w = mlx_core::where_(&zero.less_scalar(0.4).unwrap(), &Array::zeros(&[1], Dtype::F32).unwrap(), &w).unwrap();
    let mut u: Vec<f32> = (0..rows).map(|k| k as f32 / rows as f32).collect();
    u[rows as usize - 1] = 1.0 - f32::EPSILON / 2.0;
    let u = Array::from_slice(&u, &[rows]).unwrap();
    let got = sample_rows(&w, &u).unwrap().to_vec::<u32>().unwrap();
    let want = composed_sample_rows(&w, &u).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(got, want);
    // Residual draws: the kernel forms max(p − q, 0) itself.
    let p = logits(rows, v, 9).softmax(&[-1], true).unwrap();
    let q = logits(rows, v, 10).softmax(&[-1], true).unwrap();
    // Row 0 has q = p: an empty residual falls back to p.
    let q = mlx_core::concatenate(&[&p.slice_axis(0, 0, 1).unwrap(), &q.slice_axis(0, 1, rows).unwrap()], 0).unwrap();
    let u = random::uniform(0.0, 1.0, &[rows], Dtype::F32, &random::key(3).unwrap()).unwrap();
    let got = sample_residual_rows(&p, &q, &u).unwrap().to_vec::<u32>().unwrap();
    let want = composed_sample_rows(&residual_weights(&p, &q).unwrap(), &u).unwrap().to_vec::<u32>().unwrap();
    assert_eq!(got, want);
}
