//! Reverse-mode autodiff through MLX's own transforms (`value_and_grad`, `vjp`): a Rust closure
//! over arrays is traced by MLX, which calls back into Rust through the bridge.
//!
//! Rules the closure must follow (they are MLX's):
//! - gradients flow only through the arrays the closure *receives*: a forward that reads
//!   weights it captured instead of its inputs gets zero gradients for them, silently;
//! - for [`value_and_grad`] the first output is the loss and must be a scalar; further outputs
//!   are returned as values (their gradients are stopped);
//! - integer inputs (token ids, targets) stay out of `argnums`.
//!
//! An error returned by the closure, or a panic inside it, comes back as that error from the
//! call (a panic as [`Error::Closure`]); no exception or panic crosses a Rust frame.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

use crate::array::Array;
use crate::error::{mlx_err, Error, Result};
use crate::sys::ffi;

/// The closure being traced, as the bridge sees it. A failure is kept here (the bridge only
/// carries a message) and the caller takes it back after the call.
pub struct GradCtx<'a> {
    f: &'a mut TracedFn<'a>,
    failed: bool,
}

/// The closure as the trampoline calls it.
type TracedFn<'a> = dyn FnMut(&[Array]) -> std::result::Result<Vec<Array>, ClosureFailure> + 'a;

/// Why the traced closure did not return outputs; the typed error itself is held by the
/// generic wrapper that built the closure.
#[derive(Debug)]
pub(crate) struct ClosureFailure(String);

/// Called by MLX (through the C++ shim) with the tracer inputs; pushes the closure's outputs.
pub(crate) fn grad_trampoline(
    ctx: &mut GradCtx<'_>,
    inputs: &ffi::ArrayList,
    mut out: Pin<&mut ffi::ArrayList>,
) -> std::result::Result<(), String> {
    let args = list_to_vec("autodiff inputs", inputs).map_err(|e| e.to_string())?;
    let outcome = catch_unwind(AssertUnwindSafe(|| (ctx.f)(&args)));
    let outputs = match outcome {
        Ok(Ok(outputs)) => outputs,
        Ok(Err(ClosureFailure(message))) => {
            ctx.failed = true;
            return Err(message);
        }
        Err(panic) => {
            ctx.failed = true;
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with a non-string payload".into());
            return Err(format!("the differentiated closure panicked: {message}"));
        }
    };
    for a in &outputs {
        ffi::list_push(out.as_mut(), a.raw()).map_err(|e| e.what().to_string())?;
    }
    Ok(())
}

fn list_to_vec(op: &'static str, l: &ffi::ArrayList) -> Result<Vec<Array>> {
    let n = ffi::list_len(l).map_err(|e| mlx_err(op, e))?;
    (0..n).map(|i| Array::wrap(op, ffi::list_get(l, i))).collect()
}

fn to_list(op: &'static str, arrays: &[Array]) -> Result<cxx::UniquePtr<ffi::ArrayList>> {
    let mut l = ffi::new_list().map_err(|e| mlx_err(op, e))?;
    for a in arrays {
        let Some(pinned) = l.as_mut() else {
            return Err(Error::Host { op, detail: "the bridge returned a null list".into() });
        };
        ffi::list_push(pinned, a.raw()).map_err(|e| mlx_err(op, e))?;
    }
    Ok(l)
}

/// Runs `call` with a bridge context around `f`; the closure's own error wins over MLX's
/// message (which only says that the callback failed).
fn with_closure<E: From<Error>>(
    op: &'static str,
    mut f: impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, E>,
    call: impl FnOnce(&mut GradCtx<'_>) -> std::result::Result<cxx::UniquePtr<ffi::ArrayList>, cxx::Exception>,
) -> std::result::Result<Vec<Array>, E> {
    let mut failure: Option<E> = None;
    let mut wrapped = |xs: &[Array]| -> std::result::Result<Vec<Array>, ClosureFailure> {
        match f(xs) {
            Ok(outputs) if outputs.is_empty() => {
                // MLX would silently return no values and zero gradients.
                let e = Error::Host { op, detail: "the differentiated closure returned no outputs".into() };
                let message = e.to_string();
                failure = Some(e.into());
                Err(ClosureFailure(message))
            }
            Ok(outputs) => Ok(outputs),
            Err(e) => {
                failure = Some(e);
                Err(ClosureFailure(format!("the differentiated closure failed ({op})")))
            }
        }
    };
    let mut ctx = GradCtx { f: &mut wrapped, failed: false };
    let result = call(&mut ctx);
    let failed = ctx.failed;
    match result {
        Ok(list) => match list.as_ref() {
            Some(l) => Ok(list_to_vec(op, l)?),
            None => Err(Error::Host { op, detail: "the bridge returned a null list".into() }.into()),
        },
        Err(e) => match failure.take() {
            Some(typed) => Err(typed),
            None if failed => Err(Error::Closure { op, message: e.what().to_string() }.into()),
            None => Err(mlx_err(op, e).into()),
        },
    }
}

/// The outputs of `f(inputs)` and the gradients of its first output (a scalar loss) with
/// respect to `inputs[i]` for each `i` in `argnums`, in `argnums`' order.
///
/// ```
/// use mlx_core::{value_and_grad, Array};
/// let x = Array::from_slice(&[3.0f32], &[])?;
/// // d(x²)/dx = 2x
/// let (values, grads) = value_and_grad(|xs: &[Array]| Ok::<_, mlx_core::Error>(vec![xs[0].square()?]), &[x], &[0])?;
/// assert_eq!(values[0].to_vec::<f32>()?, vec![9.0]);
/// assert_eq!(grads[0].to_vec::<f32>()?, vec![6.0]);
/// # Ok::<(), mlx_core::Error>(())
/// ```
pub fn value_and_grad<E: From<Error>>(
    f: impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, E>,
    inputs: &[Array],
    argnums: &[usize],
) -> std::result::Result<(Vec<Array>, Vec<Array>), E> {
    const OP: &str = "value_and_grad";
    if argnums.is_empty() {
        return Err(Error::Host { op: OP, detail: "argnums is empty: nothing to differentiate".into() }.into());
    }
    let mut sorted = argnums.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Host { op: OP, detail: format!("argnum {} is listed twice", w[0]) }.into());
    }
    if let Some(&bad) = sorted.last().filter(|&&i| i >= inputs.len()) {
        return Err(Error::Host {
            op: OP,
            detail: format!("argnum {bad} is out of range for {} inputs", inputs.len()),
        }
        .into());
    }
    let nums: Vec<i32> = sorted
        .iter()
        .map(|&i| i32::try_from(i).map_err(|_| Error::Host { op: OP, detail: format!("argnum {i} is too large") }))
        .collect::<Result<_>>()?;
    let list = to_list(OP, inputs)?;
    let all = with_closure(OP, f, |ctx| ffi::value_and_grad(ctx, &list, &nums))?;
    let n_values = all.len() - sorted.len();
    let (values, grads_sorted) = all.split_at(n_values);
    // MLX returns gradients in sorted argnum order; hand them back in the caller's order.
    let mut grads = Vec::with_capacity(argnums.len());
    for i in argnums {
        let at = sorted.binary_search(i).map_err(|_| Error::Host { op: OP, detail: format!("argnum {i} lost") })?;
        grads.push(grads_sorted[at].clone());
    }
    Ok((values.to_vec(), grads))
}

/// The outputs of `f(primals)` and, for each primal, the vector-Jacobian product of the
/// outputs with `cotangents` (one cotangent per output, of its shape).
pub fn vjp<E: From<Error>>(
    f: impl FnMut(&[Array]) -> std::result::Result<Vec<Array>, E>,
    primals: &[Array],
    cotangents: &[Array],
) -> std::result::Result<(Vec<Array>, Vec<Array>), E> {
    const OP: &str = "vjp";
    let (p, c) = (to_list(OP, primals)?, to_list(OP, cotangents)?);
    let all = with_closure(OP, f, |ctx| ffi::vjp(ctx, &p, &c))?;
    let n_outputs = all.len().saturating_sub(primals.len());
    let (outputs, vjps) = all.split_at(n_outputs);
    Ok((outputs.to_vec(), vjps.to_vec()))
}

impl Array {
    /// The same values, with no gradient flowing back through them.
    #[track_caller]
    pub fn stop_gradient(&self) -> Result<Array> {
        Array::wrap("stop_gradient", ffi::stop_gradient(self.raw()))
    }
}
