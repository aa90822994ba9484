//! Gathers, scatters and orderings.

use crate::array::Array;
use crate::error::Result;
use crate::sys::ffi;

impl Array {
    /// Gathers slices along `axis` at `indices` (`embedding[ids]` is `take(ids, 0)`).
    #[track_caller]
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::wrap("take", ffi::take(self.raw(), indices.raw(), axis))
    }

    /// numpy's `take_along_axis`.
    #[track_caller]
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        Array::wrap("take_along_axis", ffi::take_along_axis(self.raw(), indices.raw(), axis))
    }

    /// numpy's `put_along_axis` (returns a new array).
    #[track_caller]
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        Array::wrap("put_along_axis", ffi::put_along_axis(self.raw(), indices.raw(), values.raw(), axis))
    }

    /// Indices that partition along `axis` around the `kth` element.
    #[track_caller]
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        Array::wrap("argpartition", ffi::argpartition(self.raw(), kth, axis))
    }

    /// Sorted copy along `axis`.
    #[track_caller]
    pub fn sort(&self, axis: i32) -> Result<Array> {
        Array::wrap("sort", ffi::sort(self.raw(), axis))
    }

    /// Stable sorting indices along `axis`.
    #[track_caller]
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        Array::wrap("argsort", ffi::argsort(self.raw(), axis))
    }
}
