//! Which CBLAS serves MLX's f32 matmuls on the CPU, and a run-time check that it is fast.
//!
//! MLX's CPU backend calls `cblas_sgemm` for f32 matmuls and leaves the symbol to the process:
//! the first loaded library that defines it wins. The `mlx-cpu` wheel bundles a reference BLAS
//! (≈4 GFLOP/s on two x86 cores); the build script links an optimized one (OpenBLAS or BLIS)
//! ahead of libmlx when it finds one, which makes f32 matmuls ~40× faster. bf16/f16 and
//! quantized matmuls use MLX's own kernels and are unaffected.

use std::sync::OnceLock;
use std::time::Instant;

use crate::array::Array;
use crate::device::Device;
use crate::dtype::Dtype;
use crate::error::Result;

/// The optimized BLAS library linked ahead of libmlx at build time, if any.
pub fn linked() -> Option<&'static str> {
    Some(env!("MLX_CORE_BLAS")).filter(|s| !s.is_empty())
}

/// The kernel family OpenBLAS chose for this CPU at load time (`openblas_get_corename`), when
/// OpenBLAS serves `cblas_sgemm`; `None` for BLIS, the reference BLAS, or no BLAS.
pub fn openblas_core() -> Option<String> {
    Some(crate::sys::ffi::blas_core()).filter(|s| !s.is_empty())
}

/// Why OpenBLAS runs slower than this CPU allows, if it does: an OpenBLAS older than the CPU
/// does not recognise it and falls back to generic SSE kernels (e.g. OpenBLAS 0.3.21 on
/// Sapphire Rapids: "Prescott"), several times slower than the AVX2/AVX-512 ones it can run.
/// `OPENBLAS_CORETYPE=SkylakeX` (AVX-512) or `Haswell` (AVX2), set before the process starts,
/// picks them.
pub fn openblas_fallback() -> Option<String> {
    let core = openblas_core()?;
    let generic = ["prescott", "core2", "nehalem", "atom", "katmai", "coppermine", "northwood", "banias"];
    let suggested = match row_linear_isa().as_str() {
        "avx512" => "SkylakeX",
        "avx2" => "Haswell",
        _ => return None,
    };
    generic.contains(&core.to_ascii_lowercase().as_str()).then(|| {
        format!(
            "OpenBLAS runs its generic {core} kernels on this CPU (it does not recognise it); \
             OPENBLAS_CORETYPE={suggested} makes f32 matmuls (prefill, training) several times faster"
        )
    })
}

/// Measured f32 matmul speed: the best of `reps` timed `[n, n] @ [n, n]` products after a warm-up.
#[derive(Clone, Copy, Debug)]
pub struct SgemmCheck {
    /// Matrix side.
    pub n: usize,
    /// Best observed throughput.
    pub gflops: f64,
}

impl SgemmCheck {
    /// Below this, the reference BLAS (or none) is serving f32 matmuls: an optimized BLAS does
    /// ≫ 20 GFLOP/s even on two cores, the reference one ≈4.
    pub const FAST_GFLOPS: f64 = 20.0;

    /// Whether the measured speed is that of an optimized BLAS.
    pub fn is_fast(&self) -> bool {
        self.gflops >= Self::FAST_GFLOPS
    }
}

/// Times an f32 `[n, n]` matmul on the CPU (the default device is restored afterwards).
pub fn sgemm_check(n: usize, reps: usize) -> Result<SgemmCheck> {
    let before = Device::default_device()?;
    Device::Cpu.set_default()?;
    let result = time_sgemm(n, reps.max(1));
    before.set_default()?;
    result
}

fn time_sgemm(n: usize, reps: usize) -> Result<SgemmCheck> {
    let side = n as i32;
    let a = Array::arange(0.0, (n * n) as f64, 1.0, Dtype::F32)?.reshape(&[side, side])?.mul_scalar(1e-6)?;
    let b = a.transpose(&[1, 0])?.add_scalar(0.5)?;
    crate::eval(&[&a, &b])?;
    a.matmul(&b)?.eval()?; // warm-up: thread pools, page faults
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        a.matmul(&b)?.eval()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let flops = 2.0 * (n as f64).powi(3);
    Ok(SgemmCheck { n, gflops: flops / best.max(1e-9) / 1e9 })
}

/// The row count f32 BLAS matmuls must be padded to (a multiple of) for every row to get the
/// same bits whatever the batch: optimized BLAS kernels compute full tiles of rows one way and
/// tail rows another (OpenBLAS on AVX2: tiles of 8), and single rows may take yet another path.
/// A diagnostic (`dspark doctor`): models use [`row_linear`] for the products that must agree.
/// 1 when the probe found no such padding ([`row_quantum_probe`] says which).
pub fn row_quantum() -> usize {
    row_quantum_probe().unwrap_or(1)
}

/// The row quantum as probed once per process on the CPU (a few dozen small matmuls, each row
/// compared with the same row inside batches of 64 and 128): `Some(1)` when rows are always
/// batch-invariant (MLX's bundled reference BLAS), `None` when no padding under 64 rows makes
/// them so (OpenBLAS on an AVX-512 Xeon: a row's bits depend on the batch it is in).
/// `MLX_CORE_ROW_QUANTUM=N` overrides it.
pub fn row_quantum_probe() -> Option<usize> {
    static QUANTUM: OnceLock<Option<usize>> = OnceLock::new();
    *QUANTUM.get_or_init(|| {
        if let Some(n) = std::env::var("MLX_CORE_ROW_QUANTUM").ok().and_then(|v| v.trim().parse::<usize>().ok()) {
            return Some(n.max(1));
        }
        match probe_row_quantum() {
            Ok(q) => q,
            Err(e) => {
                eprintln!("warning: probing the BLAS row quantum failed ({e}); assuming 1");
                Some(1)
            }
        }
    })
}

/// Row counts up to which [`row_linear`] serves f32 products (decode steps, verify windows);
/// larger products (prefill chunks) go to the BLAS, whose batching they need.
pub const ROW_LINEAR_MAX_ROWS: usize = 64;

/// Whether models should use [`row_linear`] for few-row f32 products on the CPU (default yes).
/// `MLX_CORE_ROW_LINEAR=0` sends them to the BLAS like every other product, which reproduces
/// mlx-lm's kernels bit for bit (the parity gate does this) but makes a decode step's bits
/// differ from the same row inside a verify window.
pub fn row_linear_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("MLX_CORE_ROW_LINEAR").map_or(true, |v| v.trim() != "0"))
}

/// Whether computations now go to the row kernels ([`row_linear`], [`row_attention`],
/// [`row_gelu`]): they are enabled and MLX's default device is the CPU (they have no GPU form).
pub fn row_kernels_active() -> Result<bool> {
    Ok(row_linear_enabled() && Device::default_device()? == Device::Cpu)
}

/// Whether `x` goes to the row kernels: it is f32 and they are active (they take f32 only).
pub fn row_kernels_for(x: &Array) -> Result<bool> {
    Ok(x.dtype() == Dtype::F32 && row_kernels_active()?)
}

// ---- where the row kernels replace MLX's ops: decided here, once per op ----

/// `gelu_approx(x)`: [`row_gelu`] where [`row_kernels_for`] says so (f32 on the CPU, switch
/// on: each element's bits its own, so decode steps and verify rows agree), otherwise MLX's
/// composed form as mlx-lm computes it (`MLX_CORE_ROW_LINEAR=0` for the parity gate).
pub fn gelu(x: &Array) -> Result<Array> {
    if row_kernels_for(x)? {
        row_gelu(x)
    } else {
        crate::gelu_approx(x)
    }
}

/// `rms_norm(x)·w` over the last axis: [`crate::row_layer::rms_norm`] (one node) where
/// [`row_kernels_for`] says so, otherwise MLX's `fast::rms_norm` (mlx-lm's;
/// `MLX_CORE_ROW_LINEAR=0` for the parity gate). Whatever the number of rows: a norm reads only
/// its own row, and one path for every size keeps a token's bits the same whether its rows are
/// normed alone or with other tokens' (q/k norms see tokens × heads rows).
pub fn rms_norm(x: &Array, w: Option<&Array>, eps: f32) -> Result<Array> {
    let weight_f32 = w.is_none_or(|w| w.dtype() == Dtype::F32);
    if weight_f32 && row_kernels_for(x)? {
        crate::row_layer::rms_norm(x, w, eps)
    } else {
        crate::fast::rms_norm(x, w, eps)
    }
}

/// The final-logit softcap `cap · tanh(x / cap)`: [`row_softcap`] where [`row_kernels_for`]
/// says so, otherwise MLX's composed form (weak scalars in x's dtype, as mlx-lm).
pub fn softcap(x: &Array, cap: f32) -> Result<Array> {
    if row_kernels_for(x)? {
        row_softcap(x, cap)
    } else {
        x.div_scalar(f64::from(cap))?.tanh()?.mul_scalar(f64::from(cap))
    }
}

/// `x @ wᵀ` for f32 weights `w` `[out, in]` (or bf16 ones, computed as the f32 values they are;
/// the row kernels read them as stored): products of at most [`ROW_LINEAR_MAX_ROWS`] rows
/// (decode steps, verify windows) go to [`row_linear`] when the row kernels are active, so a
/// row's bits do not depend on how many rows are multiplied together (an optimized BLAS does
/// not guarantee it, stepwise verification needs it); larger products (prefill) and GPU
/// products use MLX's matmul. A lower-precision `x` is promoted to f32, as MLX's matmul would.
pub fn matmul_t(x: &Array, w: &Array) -> Result<Array> {
    let shape = x.shape()?; // [.., in]
    let inp = *shape.last().unwrap_or(&0);
    let rows = x.size()? / (inp.max(1) as usize);
    let few = rows <= ROW_LINEAR_MAX_ROWS && rows > 0;
    if !(few && row_kernels_active()?) {
        // bf16 weights widened first (exact): the product of the f32 matrix, transposed view and all.
        let w = match w.dtype() {
            Dtype::Bf16 => w.astype(Dtype::F32)?,
            _ => w.clone(),
        };
        return x.matmul(&w.transpose(&[1, 0])?);
    }
    row_linear(&x.astype(Dtype::F32)?, w) // [.., out]: the kernel takes every leading axis as rows
}

/// `gelu_approx` of f32 `x` on the CPU in one vectorized pass (tanh through a polynomial exp,
/// within a few ulp of MLX's composed form, which evaluates tanh one element at a time). Each
/// element's bits depend on its value alone, so rows agree in any batch. Used with
/// [`row_linear`] (same switch); MLX's form stays the reference for parity.
#[track_caller]
pub fn row_gelu(x: &Array) -> Result<Array> {
    Array::wrap("row_gelu", crate::sys::ffi::row_gelu(x.raw()))
}

/// The final-logit softcap `cap · tanh(x / cap)` of f32 `x` on the CPU in one vectorized pass,
/// with [`row_gelu`]'s tanh (within a few ulp of MLX's, which takes a tanh per element one at a
/// time: ~1 ms for a verify window's rows over a 4096-token vocabulary). Elementwise, so a
/// row's bits do not depend on the batch. Used with [`row_linear`] (same switch).
#[track_caller]
pub fn row_softcap(x: &Array, cap: f32) -> Result<Array> {
    Array::wrap("row_softcap", crate::sys::ffi::row_softcap(x.raw(), cap))
}

/// `x − logsumexp(x)` over the last axis (sampling's log-probabilities): [`row_log_softmax`]
/// where [`row_kernels_for`] says so, otherwise MLX's composed form as mlx-lm computes it
/// (`MLX_CORE_ROW_LINEAR=0` for the parity gate). No gradient on the row form.
pub fn log_softmax(x: &Array) -> Result<Array> {
    if row_kernels_for(x)? {
        row_log_softmax(x)
    } else {
        x.subtract(&x.logsumexp(&[-1], true)?)
    }
}

/// [`log_softmax`] of f32 `x` as one vectorized CPU node: each row reduced in a fixed order
/// with a polynomial exp (within a few ulp of libm), so a row's bits are its own.
#[track_caller]
pub fn row_log_softmax(x: &Array) -> Result<Array> {
    Array::wrap("row_log_softmax", crate::sys::ffi::row_log_softmax(x.raw()))
}

/// Whether [`row_log_softmax`]'s AVX2 and portable sums give the same bits on a row of `n`
/// (true where AVX2 does not run).
pub fn row_log_softmax_paths_agree(n: usize) -> bool {
    crate::sys::ffi::row_log_softmax_paths_agree(n as i32)
}

/// The instruction set [`row_linear`] runs with on this machine: `"avx512"`, `"avx2"` or
/// `"generic"` (`MLX_CORE_NO_AVX512` set turns the AVX-512 form off). The AVX-512 and AVX2
/// forms give the same bits.
pub fn row_linear_isa() -> String {
    crate::sys::ffi::row_linear_isa()
}

/// Whether [`row_linear`]'s forms agree bit for bit on random `[m, k]` × `[n, k]` inputs: the
/// AVX-512 and AVX2 ones (where both run), each with f32 weights and with the same weights
/// stored as bf16.
pub fn row_linear_paths_agree(m: usize, k: usize, n: usize) -> bool {
    crate::sys::ffi::row_linear_paths_agree(m as i32, k as i32, n as i32)
}

/// `x @ wᵀ` for f32 `x` `[.., K]` (every leading axis rows, M in all) and `w` `[N, K]` (the
/// `nn.Linear` layout) on the CPU -> `[.., N]`, with each row's bits independent of M and of the
/// row's place: one dot product per element with a
/// fixed eight-lane order. Weights are streamed once per call, so few-row products cost about
/// what a one-row product does (memory-bound), unlike padding rows to the BLAS's tile.
#[track_caller]
pub fn row_linear(x: &Array, w: &Array) -> Result<Array> {
    Array::wrap("row_linear", crate::sys::ffi::row_linear(x.raw(), w.raw()))
}

/// Single-query attention for each row of `q` `[B, Hq, n, D]` (f32, CPU) over that row's own
/// keys and values `rows[i]` = (`[B, Hkv, L_i, D]`, same), Hkv dividing Hq (grouped queries):
/// softmax(q·kᵀ·scale)·v per row and head, in one graph node for all rows. Each row's bits
/// depend only on its own query, keys and values — not on n or the row's place — so a decode
/// step (n = 1) and the same position inside a stepwise verify window agree bit for bit. Keys
/// and values are read in place (views of a cache buffer are not copied). Returns
/// `[B, Hq, n, D]`. Enabled with [`row_linear`] (see [`row_linear_enabled`]).
#[track_caller]
pub fn row_attention(q: &Array, rows: &[(Array, Array)], scale: f32) -> Result<Array> {
    let items = std::iter::once(q).chain(rows.iter().flat_map(|(k, v)| [k, v]));
    let l = crate::array::List::new(items)?;
    Array::wrap("row_attention", crate::sys::ffi::row_attention(l.raw(), &vec![1; rows.len()], scale))
}

/// [`row_attention`] with each row's keys and values given in pieces, attended as their
/// concatenation along L (a wrapped sliding-window ring is two pieces): the bits are those of
/// the concatenated row, without copying it. `rows[i]` // pieces (`[B, Hkv, L_s, D]`, same)
#[track_caller]
pub fn row_attention_pieces(q: &Array, rows: &[Vec<(Array, Array)>], scale: f32) -> Result<Array> {
    let items = std::iter::once(q).chain(rows.iter().flatten().flat_map(|(k, v)| [k, v]));
    let l = crate::array::List::new(items)?;
    let counts: Vec<i32> = rows.iter().map(|r| r.len() as i32).collect();
    Array::wrap("row_attention", crate::sys::ffi::row_attention(l.raw(), &counts, scale))
}

/// Zero rows appended to `x` // `[R, K]` -> `[ceil(R / quantum) · quantum, K]`
pub fn pad_rows(x: &Array, quantum: usize) -> Result<Array> {
    let shape = x.shape()?;
    let rows = *shape.first().unwrap_or(&0) as usize;
    let padded = rows.div_ceil(quantum.max(1)) * quantum.max(1);
    if padded == rows {
        return Ok(x.clone());
    }
    let mut zshape = shape.clone();
    zshape[0] = (padded - rows) as i32;
    crate::concatenate(&[x.clone(), Array::zeros(&zshape, x.dtype())?], 0)
}

fn probe_row_quantum() -> Result<Option<usize>> {
    let before = Device::default_device()?;
    Device::Cpu.set_default()?;
    let result = (|| {
        // Small inner dimensions too: OpenBLAS may send a single row with a short K to another
        // kernel (seen with K = 128 on an AVX-512 Xeon).
        let sizes = [(128, 512), (256, 512), (1024, 1024)];
        let mut cases = Vec::new();
        for (i, &(k, n)) in sizes.iter().enumerate() {
            let key = crate::random::key(0x5eed + i as u64)?;
            let w = crate::random::normal(&[k, n], Dtype::F32, 0.0, 0.05, &key)?;
            let x = crate::random::normal(&[128, k], Dtype::F32, 0.0, 1.0, &key)?;
            // Both layouts: `x @ W` and `x @ Wᵀ` of a row-major [N, K] (nn.Linear's).
            let wt = w.transpose(&[1, 0])?.contiguous()?.transpose(&[1, 0])?;
            for weights in [&w, &wt] {
                for batch in [64, 128] {
                    let x = x.slice_axis(0, 0, batch)?;
                    let canon = x.matmul(weights)?;
                    canon.eval()?;
                    cases.push((x, weights.clone(), canon));
                }
            }
        }
        'candidates: for q in [1usize, 2, 4, 8, 16, 32, 64] {
            for (x, w, canon) in &cases {
                for rows in 1..=q + 1 {
                    let start = 5;
                    let xs = x.slice_axis(0, start, start + rows as i32)?;
                    let got = pad_rows(&xs, q)?.matmul(w)?.slice_axis(0, 0, rows as i32)?;
                    let want = canon.slice_axis(0, start, start + rows as i32)?;
                    if got.to_bytes()? != want.to_bytes()? {
                        continue 'candidates;
                    }
                }
            }
            return Ok(Some(q));
        }
        Ok(None)
    })();
    before.set_default()?;
    result
}
