//! Shape manipulation. Axes and dims are i32 (negative counts from the end), as in MLX.

use crate::array::{Array, List};
use crate::error::{Error, Result};
use crate::sys::ffi;

impl Array {
    /// Reshape; one dimension may be -1.
    #[track_caller]
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        Array::wrap("reshape", ffi::reshape(self.raw(), shape))
    }

    /// Permutes axes.
    #[track_caller]
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        Array::wrap("transpose", ffi::transpose(self.raw(), axes))
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn swapaxes(&self, a: i32, b: i32) -> Result<Array> {
        let n = self.ndim()? as i32;
        let norm = |x: i32| if x < 0 { x + n } else { x };
        let (a, b) = (norm(a), norm(b));
        let mut axes: Vec<i32> = (0..n).collect();
        if !(0..n).contains(&a) || !(0..n).contains(&b) {
            return Err(Error::Host {
                op: "swapaxes",
                detail: format!("axes ({a}, {b}) out of range for {n}-d array"),
            });
        }
        axes.swap(a as usize, b as usize);
        self.transpose(&axes)
    }

    /// Inserts a size-1 axis.
    #[track_caller]
    pub fn expand_dims(&self, axis: i32) -> Result<Array> {
        Array::wrap("expand_dims", ffi::expand_dims(self.raw(), axis))
    }

    /// Removes a size-1 axis.
    #[track_caller]
    pub fn squeeze(&self, axis: i32) -> Result<Array> {
        Array::wrap("squeeze", ffi::squeeze(self.raw(), axis))
    }

    /// Broadcasts to `shape`.
    #[track_caller]
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        Array::wrap("broadcast_to", ffi::broadcast_to(self.raw(), shape))
    }

    /// `self[start:stop:strides]` over every axis.
    #[track_caller]
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        Array::wrap("slice", ffi::slice(self.raw(), start, stop, strides))
    }

    /// `self[..., start:stop, ...]` along one axis (negative bounds count from the end).
    #[track_caller]
    pub fn slice_axis(&self, axis: i32, start: i32, stop: i32) -> Result<Array> {
        let shape = self.shape()?;
        let n = shape.len() as i32;
        let ax = if axis < 0 { axis + n } else { axis };
        if !(0..n).contains(&ax) {
            return Err(Error::Host { op: "slice_axis", detail: format!("axis {axis} out of range for {n}-d array") });
        }
        let len = shape[ax as usize];
        let fix = |x: i32| if x < 0 { (x + len).max(0) } else { x.min(len) };
        let mut lo = vec![0; shape.len()];
        let mut hi = shape.clone();
        lo[ax as usize] = fix(start);
        hi[ax as usize] = fix(stop).max(fix(start));
        self.slice(&lo, &hi, &vec![1; shape.len()])
    }

    /// A copy of `self` with `self[start:stop:strides] = update`.
    #[track_caller]
    pub fn slice_update(&self, update: &Array, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        Array::wrap("slice_update", ffi::slice_update(self.raw(), update.raw(), start, stop, strides))
    }

    /// A row-contiguous copy (or the same buffer if already contiguous).
    #[track_caller]
    pub fn contiguous(&self) -> Result<Array> {
        Array::wrap("contiguous", ffi::contiguous(self.raw()))
    }
}

/// Concatenates along `axis` (takes `&[Array]` or `&[&Array]`).
#[track_caller]
pub fn concatenate<A: std::borrow::Borrow<Array>>(arrays: &[A], axis: i32) -> Result<Array> {
    let l = List::new(arrays.iter().map(|a| a.borrow()))?;
    Array::wrap("concatenate", ffi::concatenate(l.raw(), axis))
}
