//! Reductions and normalisers over axes.

use crate::array::Array;
use crate::error::Result;
use crate::sys::ffi;

use ffi::ReduceOp;

macro_rules! reduction {
    ($($(#[$m:meta])* $name:ident => $op:ident),* $(,)?) => {
        impl Array {
            $(
                $(#[$m])*
                #[track_caller]
                pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    Array::wrap(stringify!($name), ffi::reduce(ReduceOp::$op, self.raw(), axes, keepdims))
                }
            )*
        }
    };
}

reduction! {
    /// Sum over `axes`.
    sum => Sum,
    /// Maximum over `axes`.
    max => Max,
    /// Minimum over `axes`.
    min => Min,
    /// Mean over `axes`.
    mean => Mean,
    /// log Σ e^x over `axes`, computed stably by MLX.
    logsumexp => LogSumExp,
    /// Product over `axes`.
    prod => Prod,
}

impl Array {
    /// Sum of every element, as a 0-d array (an empty `axes` list reduces nothing in MLX).
    #[track_caller]
    pub fn sum_all(&self) -> Result<Array> {
        let axes: Vec<i32> = (0..self.ndim()? as i32).collect();
        self.sum(&axes, false)
    }

    /// Mean of every element, as a 0-d array.
    #[track_caller]
    pub fn mean_all(&self) -> Result<Array> {
        let axes: Vec<i32> = (0..self.ndim()? as i32).collect();
        self.mean(&axes, false)
    }

    /// Index of the maximum along `axis` (first one on ties).
    #[track_caller]
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::wrap("argmax", ffi::argmax(self.raw(), axis, keepdims))
    }

    /// Index of the minimum along `axis`.
    #[track_caller]
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        Array::wrap("argmin", ffi::argmin(self.raw(), axis, keepdims))
    }

    /// Softmax over `axes`; `precise` accumulates in f32 for half inputs.
    #[track_caller]
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        Array::wrap("softmax", ffi::softmax(self.raw(), axes, precise))
    }

    /// Cumulative sum along `axis`.
    #[track_caller]
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        Array::wrap("cumsum", ffi::cumsum(self.raw(), axis, reverse, inclusive))
    }

    /// Matrix product with broadcasting over leading axes.
    #[track_caller]
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        Array::wrap("matmul", ffi::matmul(self.raw(), other.raw()))
    }
}
