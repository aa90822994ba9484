//! How a product of a few rows keeps each row's bits independent of the other rows where
//! mlx-core's row kernels do not run (a GPU).
//!
//! A stepwise verify needs every verify row to get the bits of the decode step it stands in for
//! (docs/numerics.md, "Why the verify forward is stepwise"). GPU BLAS libraries pick one kernel
//! for a single row (a GEMV) and tiled kernels for several, and the two round differently: on
//! CUDA the default pair's greedy speculative output left plain decoding's within 128 tokens.
//! Two cures, chosen by [`ExactRows`]:
//! - **block** (the default on a GPU): every product of up to [`ROW_BLOCK`] rows, one-token
//!   decode steps included, runs as one product of exactly `ROW_BLOCK` rows (zero rows appended),
//!   and products of up to 64 rows as `ROW_BLOCK`-row pieces. Decode steps and verify windows
//!   then run one kernel on one shape, and a row of a GEMM depends only on its own inputs.
//!   One launch per product and piece, as before; each pays for 16 rows of arithmetic, which a
//!   memory-bound decode step hides.
//! - **row by row**: each row its own product shaped as a decode step's (one launch per row).
//!
//! On the CPU neither is needed (the row kernels are batch-invariant, and the parity gate wants
//! MLX's own products with them off), unless asked for: [`set_exact_rows`] or
//! `DSPARK_EXACT_ROWS=block|row-by-row|none` (read once), which is how the block is tested here
//! (MLX's CPU products, like a GPU's, round a lone row differently from a batch).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use mlx_core::{Array, Device};

use super::LinearWeights;
use crate::error::{Error, Result};

/// Rows of the one product shape every few-row product runs as in [`ExactRows::Block`].
pub const ROW_BLOCK: usize = 16;

/// How products of 1 to 64 rows are computed where the row kernels do not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactRows {
    /// As they come (the CPU's default: its row kernels are batch-invariant).
    None,
    /// Padded to [`ROW_BLOCK`]-row pieces, decode steps included (the GPU's default).
    Block,
    /// One product per row, shaped as a decode step's.
    RowByRow,
}

impl ExactRows {
    fn code(self) -> u8 {
        match self {
            ExactRows::None => 1,
            ExactRows::Block => 2,
            ExactRows::RowByRow => 3,
        }
    }

    fn from_code(c: u8) -> Option<ExactRows> {
        match c {
            1 => Some(ExactRows::None),
            2 => Some(ExactRows::Block),
            3 => Some(ExactRows::RowByRow),
            _ => None,
        }
    }

    /// Parses `block`, `row-by-row` or `none`.
    pub fn parse(s: &str) -> Result<ExactRows> {
        match s.trim() {
            "block" => Ok(ExactRows::Block),
            "row-by-row" => Ok(ExactRows::RowByRow),
            "none" => Ok(ExactRows::None),
            other => Err(Error::Input {
                op: "DSPARK_EXACT_ROWS",
                detail: format!("{other:?}: expected block, row-by-row or none"),
            }),
        }
    }
}

/// 0: no override (the device decides).
static OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// Overrides the device's choice for this process (`None`: back to the default). For tests and
/// measurements; `DSPARK_EXACT_ROWS` does the same from the environment.
pub fn set_exact_rows(mode: Option<ExactRows>) {
    OVERRIDE.store(mode.map_or(0, ExactRows::code), Ordering::Relaxed);
}

/// The mode products run in now: the override, else `DSPARK_EXACT_ROWS`, else block on a GPU
/// and none on the CPU.
pub fn exact_rows() -> Result<ExactRows> {
    if let Some(m) = ExactRows::from_code(OVERRIDE.load(Ordering::Relaxed)) {
        return Ok(m);
    }
    static ENV: OnceLock<Option<std::result::Result<ExactRows, String>>> = OnceLock::new();
    let env = ENV.get_or_init(|| {
        std::env::var("DSPARK_EXACT_ROWS").ok().map(|v| ExactRows::parse(&v).map_err(|e| e.to_string()))
    });
    match env {
        Some(Ok(m)) => Ok(*m),
        Some(Err(e)) => Err(Error::Input { op: "DSPARK_EXACT_ROWS", detail: e.clone() }),
        None => Ok(match Device::default_device()? {
            Device::Gpu => ExactRows::Block,
            _ => ExactRows::None,
        }),
    }
}

impl LinearWeights {
    /// `x @ Wᵀ` under [`exact_rows`] // `[.., in]` -> `[.., out]`
    pub(super) fn matmul_t_exact(&self, x: &Array) -> Result<Array> {
        let inp = x.dim(-1)?;
        let rows = x.size()? / (inp.max(1) as usize);
        let few = (1..=mlx_core::blas::ROW_LINEAR_MAX_ROWS).contains(&rows);
        match exact_rows()? {
            ExactRows::Block if few => self.matmul_t_blocked(x, rows),
            ExactRows::RowByRow if few && rows > 1 => self.matmul_t_row_by_row(x, rows),
            _ => self.matmul_t_whole(x),
        }
    }

    /// The rows in [`ROW_BLOCK`]-row pieces, the last one padded with zero rows.
    pub(super) fn matmul_t_blocked(&self, x: &Array, rows: usize) -> Result<Array> {
        let mut shape = x.shape()?;
        let inp = *shape.last().unwrap_or(&0);
        let padded = mlx_core::blas::pad_rows(&x.reshape(&[rows as i32, inp])?, ROW_BLOCK)?; // [P, in]
        let pieces = (0..padded.dim(0)? / ROW_BLOCK as i32)
            .map(|b| {
                let b = b * ROW_BLOCK as i32;
                self.matmul_t_whole(&padded.slice_axis(0, b, b + ROW_BLOCK as i32)?)
                // [ROW_BLOCK, out]
            })
            .collect::<Result<Vec<_>>>()?;
        let all = match pieces.as_slice() {
            [one] => one.clone(),
            _ => mlx_core::concatenate(&pieces.iter().collect::<Vec<_>>(), 0)?,
        };
        if let Some(last) = shape.last_mut() {
            *last = -1;
        }
        Ok(all.slice_axis(0, 0, rows as i32)?.reshape(&shape)?)
    }

    /// One product per row, each shaped as a one-token decode step's // `[.., in]` -> `[.., out]`
    pub(super) fn matmul_t_row_by_row(&self, x: &Array, rows: usize) -> Result<Array> {
        let shape = x.shape()?;
        let inp = *shape.last().unwrap_or(&0);
        let flat = x.reshape(&[rows as i32, inp])?; // [R, in]
        let outs = (0..rows as i32)
            .map(|r| self.matmul_t_whole(&flat.slice_axis(0, r, r + 1)?.reshape(&[1, 1, inp])?))
            .collect::<Result<Vec<_>>>()?; // R × [1, 1, out]
        let refs: Vec<&Array> = outs.iter().collect();
        let mut out_shape = shape;
        if let Some(last) = out_shape.last_mut() {
            *last = -1;
        }
        Ok(mlx_core::concatenate(&refs, 1)?.reshape(&out_shape)?)
    }
}
