//! Explicit-key random numbers (MLX's threefry keys), so sampling is reproducible and can follow
//! the same split chain as mlx-lm's global RNG (docs/numerics.md, "Random numbers").

use crate::array::{Array, List};
use crate::error::{mlx_err, Error, Result};
use crate::sys::ffi;
use crate::Dtype;

/// `mx.random.key(seed)`.
#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    Array::wrap("random.key", ffi::random_key(seed))
}

/// `mx.random.split(key)` into two keys.
#[track_caller]
pub fn split(key: &Array) -> Result<(Array, Array)> {
    let mut v = split_n(key, 2)?.into_iter();
    match (v.next(), v.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(Error::Host { op: "random.split", detail: "expected two keys".into() }),
    }
}

/// `mx.random.split(key, num)`.
#[track_caller]
pub fn split_n(key: &Array, num: i32) -> Result<Vec<Array>> {
    let l = ffi::random_split(key.raw(), num).map_err(|e| mlx_err("random.split", e))?;
    List(l).into_vec("random.split")
}

/// Uniform samples in [low, high).
#[track_caller]
pub fn uniform(low: f64, high: f64, shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    let lo = Array::scalar(low, dtype)?;
    let hi = Array::scalar(high, dtype)?;
    Array::wrap("random.uniform", ffi::random_uniform(lo.raw(), hi.raw(), shape, dtype.code(), key.raw()))
}

/// Normal samples with mean `loc` and standard deviation `scale`.
#[track_caller]
pub fn normal(shape: &[i32], dtype: Dtype, loc: f32, scale: f32, key: &Array) -> Result<Array> {
    Array::wrap("random.normal", ffi::random_normal(shape, dtype.code(), loc, scale, key.raw()))
}

/// Samples indices from unnormalised log-probabilities along `axis`.
#[track_caller]
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    Array::wrap("random.categorical", ffi::random_categorical(logits.raw(), axis, key.raw()))
}

/// A key chain that behaves like MLX's global RNG state: each draw splits the state and uses
/// the second half, exactly as `mx.random.*` does without an explicit key.
#[derive(Clone, Debug)]
pub struct KeyChain {
    state: Array,
}

impl KeyChain {
    /// Equivalent to `mx.random.seed(seed)`.
    #[track_caller]
    pub fn new(seed: u64) -> Result<KeyChain> {
        Ok(KeyChain { state: key(seed)? })
    }

    /// The chain's current state (a key array), to checkpoint a run's RNG.
    pub fn state(&self) -> &Array {
        &self.state
    }

    /// Resumes a chain from a state returned by [`KeyChain::state`].
    pub fn from_state(state: Array) -> KeyChain {
        KeyChain { state }
    }

    /// The next subkey; advances the state.
    #[track_caller]
    pub fn next_key(&mut self) -> Result<Array> {
        let (state, sub) = split(&self.state)?;
        self.state = state;
        Ok(sub)
    }
}
