//! The confidence heads: c_k = σ(w·x_k + b), the drafter's estimate that draft k is accepted
//! given the drafts before it were.
//!
//! The paper's head reads x_k = [h_k; W1[x_{k−1}]] (the backbone row and the Markov embedding
//! of the previous token). With `confLaw` it also reads two facts of the draft law p^d_k: its
//! top-1 log-probability and its entropy. A linear head cannot compute either from h_k (they
//! pass through the LM head and a softmax), yet they are what acceptance hinges on: under
//! greedy decoding a draft is accepted when its argmax is the target's, which a flat draft law
//! rarely gets right.
//!
//! Two heads can share these inputs: `conf.*`, trained on the sampled acceptance
//! 1 − ½‖p^d_k − p^t_k‖₁, and with `greedyHead` `conf_greedy.*`, trained on greedy acceptance
//! (argmax p^d_k = argmax p^t_k). The events differ, so one head cannot predict both.

use gemma4::sampling::SamplerConfig;
use mlx_core::{concatenate, Array, Dtype};

use crate::error::Result;

/// How many law features `confLaw` appends.
pub const LAW_FEATURES: usize = 2;

/// log max_v p^d(v) and the entropy H(p^d) of the draft law of `logits` // `[..., V]` f32 ->
/// `[..., 2]` f32.
pub fn law_features(logits: &Array) -> Result<Array> {
    // One softmax through the sampling kernels on the CPU: composed, its exp runs one element
    // at a time, and a block's γ·V of them cost the default pair ~0.08 decode steps a round.
    let t1 = SamplerConfig { temperature: 1.0, ..SamplerConfig::default() };
    let p = crate::verify::probs::probabilities(logits, &t1)?;
    // log p_max = max l − log Z (p_max ≥ 1/V, so finite).
    let log_top = p.max(&[-1], true)?.log()?;
    // H = log Z − Σ p·l, with log Z = max l − log p_max.
    let mean_logit = p.multiply(logits)?.sum(&[-1], true)?;
    let entropy = logits.max(&[-1], true)?.subtract(&log_top)?.subtract(&mean_logit)?;
    Ok(concatenate(&[&log_top, &entropy], -1)?)
}

/// A head's input x_k from the backbone rows `h` // `[..., D]`, the Markov embeddings `e1`
/// // `[..., r]` and, with `law`, the draft logits // `[..., V]` -> `[..., D + r (+ 2)]` f32.
pub fn inputs(h: &Array, e1: &Array, logits: &Array, law: bool) -> Result<Array> {
    let (h, e1) = (h.astype(Dtype::F32)?, e1.astype(Dtype::F32)?);
    Ok(if law { concatenate(&[&h, &e1, &law_features(logits)?], -1)? } else { concatenate(&[&h, &e1], -1)? })
}

/// σ(x·w + b) for inputs `x` // `[..., I]`, `w` // `[I, 1]`, `b` // `[1]` -> `[...]`.
pub fn head(x: &Array, w: &Array, b: &Array) -> Result<Array> {
    Ok(x.matmul(w)?.add(b)?.sigmoid()?.squeeze(-1)?)
}

/// A proposed block's confidences, `head(inputs(h, e1, logits, law), w, b)` // `[n, D]`,
/// `[n, r]`, `[n, V]` -> `[n]`. On the CPU in f32 it is one kernel (`mlx_core::row_confidence`):
/// composed, its ~15 small nodes cost about 4% of a round of the default pair, paid before
/// every verify the schedule reads them for. The values agree to rounding, and the window only
/// needs them to be a function of the block.
pub fn score(h: &Array, e1: &Array, logits: &Array, law: bool, w: &Array, b: &Array) -> Result<Array> {
    let all_f32 = [h, e1, w, b].iter().all(|a| a.dtype() == Dtype::F32);
    if all_f32 && mlx_core::blas::row_kernels_for(logits)? {
        return Ok(mlx_core::row_confidence::confidence(&[h, e1], w, b, law.then_some(logits))?);
    }
    head(&inputs(h, e1, logits, law)?, w, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_core::random;

    #[test]
    fn the_one_node_score_is_the_composed_head() {
        let key = |i| random::key(i).unwrap();
        let (n, d, r, v) = (5, 24, 6, 300);
        let h = random::normal(&[n, d], Dtype::F32, 0.0, 1.0, &key(1)).unwrap();
        let e1 = random::normal(&[n, r], Dtype::F32, 0.0, 1.0, &key(2)).unwrap();
        // Rows from flat to peaked, so the law features vary.
        let scale = Array::from_slice(&[0.1f32, 1.0, 3.0, 8.0, 20.0], &[n, 1]).unwrap();
        let logits = random::normal(&[n, v], Dtype::F32, 0.0, 1.0, &key(3)).unwrap().multiply(&scale).unwrap();
        let b = Array::from_slice(&[0.3f32], &[1]).unwrap();
        for law in [false, true] {
            let width = d + r + if law { LAW_FEATURES as i32 } else { 0 };
            let w = random::normal(&[width, 1], Dtype::F32, 0.0, 0.2, &key(4)).unwrap();
            let composed: Vec<f32> = head(&inputs(&h, &e1, &logits, law).unwrap(), &w, &b).unwrap().to_vec().unwrap();
            let kernel = mlx_core::row_confidence::confidence(&[&h, &e1], &w, &b, law.then_some(&logits)).unwrap();
            let kernel: Vec<f32> = kernel.to_vec().unwrap();
            assert_eq!(kernel.len(), n as usize);
            for (k, c) in kernel.iter().zip(&composed) {
                assert!((k - c).abs() < 1e-5, "law {law}: {kernel:?} vs {composed:?}");
            }
            // `score` takes one of the two forms.
            let scored: Vec<f32> = score(&h, &e1, &logits, law, &w, &b).unwrap().to_vec().unwrap();
            assert!(scored == kernel || scored == composed, "law {law}: {scored:?}");
            assert!(composed.iter().any(|c| (c - composed[0]).abs() > 1e-3), "the rows must differ: {composed:?}");
        }
        // A weight vector of the wrong width is refused, not read past its end.
        let short = random::normal(&[d + r, 1], Dtype::F32, 0.0, 0.2, &key(4)).unwrap();
        let e = mlx_core::row_confidence::confidence(&[&h, &e1], &short, &b, Some(&logits)).unwrap_err();
        assert!(e.to_string().contains("weights"), "{e}");
    }
}
