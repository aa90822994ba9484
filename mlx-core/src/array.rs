//! `Array`: an owned, refcounted handle to an MLX array. Clone copies the handle (MLX arrays
//! share their buffers), Drop releases it. Nothing here evaluates unless it says so: MLX is
//! lazy, and `eval` (or reading data back) is what runs the graph.

use cxx::UniquePtr;

use crate::error::{mlx_err, Error, Result};
use crate::sys::ffi;
use crate::{Dtype, Element};

/// An MLX array.
pub struct Array {
    pub(crate) inner: UniquePtr<ffi::Array>,
}

impl Array {
    /// Wraps a bridge result, naming `op` in the error.
    #[track_caller]
    pub(crate) fn wrap(
        op: &'static str,
        r: std::result::Result<UniquePtr<ffi::Array>, cxx::Exception>,
    ) -> Result<Array> {
        match r {
            Ok(inner) if !inner.is_null() => Ok(Array { inner }),
            Ok(_) => Err(Error::Mlx {
                op,
                message: "bridge returned a null array".into(),
                location: std::panic::Location::caller(),
            }),
            Err(e) => Err(mlx_err(op, e)),
        }
    }

    pub(crate) fn raw(&self) -> &ffi::Array {
        // The pointer is non-null by construction (`wrap` refuses null).
        self.inner.as_ref().expect("Array handle is never null")
    }

    /// Copies a host slice into a new array of `shape`.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size());
        for &x in data {
            x.extend_le_bytes(&mut bytes);
        }
        Self::from_bytes(&bytes, shape, T::DTYPE)
    }

    /// Builds an array from little-endian bytes of `dtype` (bf16 and f16 included).
    #[track_caller]
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        Self::wrap("from_bytes", ffi::from_bytes(bytes, shape, dtype.code()))
    }

    /// A 0-d array holding `v` converted to `dtype` (through f32 for float types, as MLX's
    /// Python binding converts a Python float).
    #[track_caller]
    pub fn scalar(v: f64, dtype: Dtype) -> Result<Array> {
        Self::wrap("scalar", ffi::scalar_f64(v, dtype.code()))
    }

    /// An array of `shape` filled with `v`.
    #[track_caller]
    pub fn full(shape: &[i32], v: f64, dtype: Dtype) -> Result<Array> {
        Self::wrap("full", ffi::full(shape, v, dtype.code()))
    }

    /// Zeros of `shape`.
    #[track_caller]
    pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Self::full(shape, 0.0, dtype)
    }

    /// Ones of `shape`.
    #[track_caller]
    pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
        Self::full(shape, 1.0, dtype)
    }

    /// `[start, stop)` in steps of `step`, as MLX's `arange`.
    #[track_caller]
    pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
        Self::wrap("arange", ffi::arange(start, stop, step, dtype.code()))
    }

    /// The shape (MLX uses i32 dimensions).
    #[track_caller]
    pub fn shape(&self) -> Result<Vec<i32>> {
        ffi::shape(self.raw()).map_err(|e| mlx_err("shape", e))
    }

    /// Number of dimensions.
    #[track_caller]
    pub fn ndim(&self) -> Result<usize> {
        Ok(self.shape()?.len())
    }

    /// Size of dimension `axis` (negative counts from the end); an error names the axis and
    /// the shape when there is no such dimension.
    #[track_caller]
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let s = self.shape()?;
        let n = s.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        if (0..n).contains(&a) {
            Ok(s[a as usize])
        } else {
            Err(Error::Host { op: "dim", detail: format!("axis {axis} is out of range for shape {s:?}") })
        }
    }

    /// Total number of elements.
    #[track_caller]
    pub fn size(&self) -> Result<usize> {
        Ok(self.shape()?.iter().map(|&d| d.max(0) as usize).product())
    }

    /// Element type.
    pub fn dtype(&self) -> Dtype {
        ffi::dtype(self.raw()).ok().and_then(|c| Dtype::from_code(c).ok()).unwrap_or(Dtype::F32)
    }

    /// Bytes of the array's data.
    pub fn nbytes(&self) -> usize {
        ffi::nbytes(self.raw()).unwrap_or(0)
    }

    /// Where an evaluated array's data starts in memory (None before evaluation): tells whether
    /// two arrays share a buffer, e.g. that a cache write rewrote its buffer in place.
    pub fn buffer_address(&self) -> Option<usize> {
        ffi::buffer_address(self.raw()).ok().filter(|&a| a != 0)
    }

    /// Evaluates the graph that produces this array.
    #[track_caller]
    pub fn eval(&self) -> Result<()> {
        eval(&[self])
    }

    /// Evaluates and copies the data out as little-endian bytes in row-major order.
    #[track_caller]
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        ffi::to_bytes(self.raw()).map_err(|e| mlx_err("to_bytes", e))
    }

    /// Evaluates and copies the data out; the dtype must be `T`'s.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let got = self.dtype();
        if got != T::DTYPE {
            return Err(Error::Dtype { op: "to_vec", expected: T::DTYPE, got });
        }
        let bytes = self.to_bytes()?;
        Ok(bytes.chunks_exact(T::DTYPE.size()).map(T::from_le_bytes).collect())
    }

    /// Evaluates, converts to f32 on the device and copies out.
    #[track_caller]
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        self.astype(Dtype::F32)?.to_vec::<f32>()
    }

    /// The single element of a one-element array.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::Host { op: "item", detail: format!("array has {} elements, expected 1", v.len()) }),
        }
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        // Copying an MLX handle only bumps a refcount; it cannot fail short of allocation failure.
        Array { inner: ffi::clone_array(self.raw()).expect("copying an MLX array handle") }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Array({:?}, {})", self.shape(), self.dtype())
    }
}

/// An owned list of arrays on the C++ side, for variadic calls.
pub(crate) struct List(pub(crate) UniquePtr<ffi::ArrayList>);

impl List {
    #[track_caller]
    pub(crate) fn new<'a>(items: impl IntoIterator<Item = &'a Array>) -> Result<List> {
        let mut l = ffi::new_list().map_err(|e| mlx_err("list", e))?;
        for a in items {
            ffi::list_push(l.pin_mut(), a.raw()).map_err(|e| mlx_err("list", e))?;
        }
        Ok(List(l))
    }

    #[track_caller]
    pub(crate) fn opt(a: Option<&Array>) -> Result<List> {
        List::new(a)
    }

    pub(crate) fn raw(&self) -> &ffi::ArrayList {
        self.0.as_ref().expect("ArrayList handle is never null")
    }

    #[track_caller]
    pub(crate) fn into_vec(self, op: &'static str) -> Result<Vec<Array>> {
        let n = ffi::list_len(self.raw()).map_err(|e| mlx_err(op, e))?;
        (0..n).map(|i| Array::wrap(op, ffi::list_get(self.raw(), i))).collect()
    }
}

/// Evaluates several arrays together (one graph run).
#[track_caller]
pub fn eval(arrays: &[&Array]) -> Result<()> {
    let l = List::new(arrays.iter().copied())?;
    ffi::eval(l.raw()).map_err(|e| mlx_err("eval", e))
}

/// Schedules evaluation and returns at once; a later `eval` or read waits for it.
#[track_caller]
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let l = List::new(arrays.iter().copied())?;
    ffi::async_eval(l.raw()).map_err(|e| mlx_err("async_eval", e))
}

/// The unevaluated graph nodes that evaluating `arrays` would run, by primitive name (one entry
/// per node). A diagnostic: on a CPU each node costs microseconds of host work, so a decode
/// step's node count is its fixed cost.
#[track_caller]
pub fn pending_nodes(arrays: &[&Array]) -> Result<Vec<String>> {
    let l = List::new(arrays.iter().copied())?;
    ffi::pending_nodes(l.raw()).map_err(|e| mlx_err("pending_nodes", e))
}

/// Waits for all scheduled work on the default stream.
#[track_caller]
pub fn synchronize() -> Result<()> {
    ffi::synchronize().map_err(|e| mlx_err("synchronize", e))
}

/// The version string of the linked libmlx.
pub fn mlx_version() -> String {
    ffi::mlx_version().unwrap_or_default()
}
