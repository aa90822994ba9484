//! A logistic head over rows and the laws of their logits, one graph node on the CPU
//! (`sys/row_confidence.cc`): `c_r = σ(Σ_j x_j[r]·w_j + f(l_r)·w_f + b)`, with the row features x_j
//! taken in order and f(l) = (log max softmax(l), entropy of softmax(l)) when logits are given.
//!
//! A drafter scores each proposed block this way before the verify window is chosen; composed
//! from MLX's ops it is about fifteen small nodes, each ~20 µs of scheduling on a CPU. The
//! values are the composed form's up to the rounding of the sums. f32 and CPU only, and no
//! gradient: training keeps the composed form.

use crate::array::{Array, List};
use crate::error::Result;

/// Per-row confidences. `parts` // `[R, d_j]` f32 each, `w` // `Σ d_j (+ 2)` f32 (any shape),
/// `b` // one f32, `law_of` // `[R, V]` f32 -> `[R]` f32
#[track_caller]
pub fn confidence(parts: &[&Array], w: &Array, b: &Array, law_of: Option<&Array>) -> Result<Array> {
    let parts = List::new(parts.iter().copied())?;
    let law = List::new(law_of)?;
    Array::wrap("row_confidence", crate::sys::ffi::row_confidence(parts.raw(), w.raw(), b.raw(), law.raw()))
}
