//! A DSpark drafter's greedy Markov walk over its draft blocks in one graph node on the CPU
//! (`sys/row_markov.cc`).
//!
//! Position k of a block takes `l_k = u_k + W2·W1[x_{k−1}]` and `x_k = argmax l_k`, starting
//! from the anchor. Composed from MLX's ops that is about a dozen nodes per position; the node
//! gives the composed walk's bits (row-invariant product, f32 add, first maximum). f32 only.

use crate::array::{Array, List};
use crate::error::Result;

/// The walk's outputs, request after request (`n_s` rows each).
#[derive(Debug)]
pub struct Walk {
    /// `[T]` uint32: the drafted tokens
    pub tokens: Array,
    /// `[T, V]` f32: each position's logits `l_k`
    pub logits: Array,
    /// `[T, r]` f32: each position's `W1[x_{k−1}]`
    pub e1: Array,
}

/// Walks R blocks: u // `[T, V]` (request s's `ns[s]` rows in order), w1 and w2 // `[V, r]`,
/// anchors // `[R]` uint32, with T = Σ ns.
#[track_caller]
pub fn greedy(u: &Array, w1: &Array, w2: &Array, anchors: &Array, ns: &[usize]) -> Result<Walk> {
    let ns: Vec<i32> = ns.iter().map(|&n| n as i32).collect();
    let out = crate::sys::ffi::row_markov_greedy(u.raw(), w1.raw(), w2.raw(), anchors.raw(), &ns)
        .map_err(|e| crate::error::mlx_err("row_markov_greedy", e))?;
    let mut out = List(out).into_vec("row_markov_greedy")?.into_iter();
    match (out.next(), out.next(), out.next()) {
        (Some(tokens), Some(logits), Some(e1)) => Ok(Walk { tokens, logits, e1 }),
        _ => Err(crate::Error::Mlx {
            op: "row_markov_greedy",
            message: "expected three outputs".into(),
            location: std::panic::Location::caller(),
        }),
    }
}
