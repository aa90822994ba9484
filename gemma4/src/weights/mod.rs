//! Checkpoint tensors: shard discovery and header checks (`files.rs`), mlx-lm's sanitize rules
//! (`sanitize.rs`) and a `WeightMap` that hands tensors to the model by name, checks shapes and
//! element types, and refuses leftovers (mlx-lm loads with `strict=True`).
//!
//! Names are normalised to the text model's own paths (`layers.0.self_attn.q_proj.weight`,
//! `embed_tokens.weight`, `lm_head.weight`); `module_prefix` keeps the checkpoint's prefix
//! (`model.` or `language_model.model.`) because quantization overrides are keyed by full path.

mod exact_rows;
mod files;
mod sanitize;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use mlx_core::quant::Quantized;
use mlx_core::{Array, Dtype};

use crate::compute::Conversion;
use crate::config::{QuantizationConfig, TextConfig};
use crate::error::{Error, Result};

pub use exact_rows::{exact_rows, set_exact_rows, ExactRows, ROW_BLOCK};
pub use files::{check_header, load_raw, load_raw_files, read_index, shard_paths, INDEX};
pub use sanitize::sanitize;

/// Float element types: what dense weights, norms, scalars and quantization scales/biases hold.
fn is_float(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::Bf16)
}

/// A linear layer's weights: dense `[out, in]` or MLX-affine quantized.
#[derive(Clone, Debug)]
pub enum LinearWeights {
    /// A plain `[out, in]` matrix.
    Dense(Array),
    /// A bf16 `[out, in]` matrix of a model computing in f32 on the CPU: every bf16 value is an
    /// f32 value, so the row kernels read it as stored (half the bytes a step streams) and other
    /// products widen it first; either way the bits are those of the converted f32 matrix.
    Bf16AsF32(Array),
    /// Packed MLX-affine weight with its scales and biases.
    Quantized(Quantized),
}

impl LinearWeights {
    /// `x @ Wᵀ` for W `[out, in]`: the `nn.Linear` / tied-head product // `[.., in]` -> `[.., out]`
    /// A few rows (decode steps, verify windows) keep their bits whatever the other rows: see
    /// [`ExactRows`].
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        self.matmul_t_exact(x)
    }

    fn matmul_t_whole(&self, x: &Array) -> Result<Array> {
        Ok(match self {
            LinearWeights::Dense(w) if w.dtype() == Dtype::F32 => mlx_core::blas::matmul_t(x, w)?,
            LinearWeights::Dense(w) => x.matmul(&w.transpose(&[1, 0])?)?,
            LinearWeights::Bf16AsF32(w) => mlx_core::blas::matmul_t(x, w)?,
            LinearWeights::Quantized(q) => q.matmul_t(x)?,
        })
    }

    /// The matrix the fused row kernels read, when there is one: plain f32, or bf16 read as f32.
    pub fn row_matrix(&self) -> Option<&Array> {
        match self {
            LinearWeights::Dense(w) if w.dtype() == Dtype::F32 => Some(w),
            LinearWeights::Bf16AsF32(w) => Some(w),
            _ => None,
        }
    }

    /// The matrix as the fused row nodes take it: [`Self::row_matrix`], or an 8/4-bit matrix
    /// with f32 scales read packed.
    pub fn row_weight(&self) -> Option<mlx_core::row_layer::RowWeight<'_>> {
        use mlx_core::row_layer::RowWeight;
        match self {
            LinearWeights::Quantized(q) if q.row_readable() => Some(RowWeight::Packed(q)),
            _ => self.row_matrix().map(RowWeight::Dense),
        }
    }

    /// Rows at `ids` of a `[rows, dims]` table (quantized: gather, then dequantize) // [..] -> `[.., dims]`
    pub fn gather(&self, ids: &Array) -> Result<Array> {
        Ok(match self {
            LinearWeights::Dense(w) => w.take(ids, 0)?,
            LinearWeights::Bf16AsF32(w) => w.take(ids, 0)?.astype(Dtype::F32)?,
            LinearWeights::Quantized(q) => {
                let mut shape = ids.shape()?;
                let rows = q.gather_rows(&ids.reshape(&[-1])?)?;
                shape.push(-1);
                rows.reshape(&shape)?
            }
        })
    }
}

/// Hands out tensors by name and remembers which were taken.
pub struct WeightMap {
    dir: PathBuf,
    tensors: BTreeMap<String, Array>,
    taken: BTreeSet<String>,
    /// Tensor name → the shard file it came from, for error messages (empty for in-memory maps).
    origin: BTreeMap<String, String>,
    prefix: &'static str,
    quantization: Option<QuantizationConfig>,
    conversion: Conversion,
    bf16_matrices: bool,
    packed_matrices: bool,
}

impl WeightMap {
    /// Loads and sanitizes a checkpoint directory.
    pub fn load(dir: &Path, cfg: &TextConfig) -> Result<WeightMap> {
        // Sanitize file by file (its rules act per name) to remember where each tensor lives.
        let mut tensors = BTreeMap::new();
        let mut origin = BTreeMap::new();
        let mut prefix = "";
        for (file, raw) in load_raw_files(dir)? {
            let (clean, p) = sanitize(raw, cfg)?;
            prefix = p;
            origin.extend(clean.keys().map(|k| (k.clone(), file.clone())));
            tensors.extend(clean);
        }
        let mut wm = WeightMap::from_tensors(dir, tensors, prefix, cfg.quantization.clone());
        wm.origin = origin;
        Ok(wm)
    }

    /// Wraps already-sanitized tensors (tests, converters).
    pub fn from_tensors(
        dir: &Path,
        tensors: BTreeMap<String, Array>,
        prefix: &'static str,
        quantization: Option<QuantizationConfig>,
    ) -> WeightMap {
        WeightMap {
            dir: dir.to_path_buf(),
            tensors,
            taken: BTreeSet::new(),
            origin: BTreeMap::new(),
            prefix,
            quantization,
            conversion: Conversion::NONE,
            bf16_matrices: false,
            packed_matrices: false,
        }
    }

    /// With a conversion to f32: hand out bf16 dense matrices (not stacked experts) as
    /// [`LinearWeights::Bf16AsF32`] instead of converting them, for the CPU's row kernels.
    pub fn keep_bf16_matrices(&mut self, keep: bool) {
        self.bf16_matrices = keep;
    }

    /// With a conversion that dequantizes to f32: hand out 8- and 4-bit matrices (not stacked
    /// experts) packed, their scales and biases in f32, for the CPU's packed row kernel
    /// (`mlx_core::quant::row_quantized_linear`), instead of dequantizing them; other widths
    /// are dequantized as before.
    pub fn keep_packed_matrices(&mut self, keep: bool) {
        self.packed_matrices = keep;
    }

    /// Casts (and dequantizes) tensors as they are handed out; see [`crate::compute`].
    pub fn set_conversion(&mut self, conversion: Conversion) {
        self.conversion = conversion;
    }

    /// Whether any tensor is a packed quantized weight.
    pub fn has_quantized(&self) -> bool {
        self.tensors.values().any(|a| a.dtype() == Dtype::U32)
    }

    /// Bytes the weights would take dense in f32 (packed quantized weights counted at their
    /// logical size; their scales and biases, which dequantizing drops, not at all).
    pub fn f32_bytes(&self) -> u64 {
        let default_bits = self.quantization.as_ref().and_then(|q| q.default).map_or(4, |s| s.bits()) as u64;
        let mut elements = 0u64;
        for (name, a) in &self.tensors {
            let n = a.size().unwrap_or(0) as u64;
            if a.dtype() == Dtype::U32 {
                elements += n * 32 / default_bits.max(1);
            } else if let Some(module) = name.strip_suffix(".scales").or_else(|| name.strip_suffix(".biases")) {
                if !self.tensors.contains_key(&format!("{module}.weight")) {
                    elements += n;
                }
            } else {
                elements += n;
            }
        }
        elements * 4
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Takes a tensor without checking its shape.
    pub fn get(&mut self, name: &str) -> Result<Array> {
        match self.tensors.get(name) {
            Some(a) => {
                self.taken.insert(name.to_string());
                Ok(a.clone())
            }
            None => Err(Error::MissingWeight { dir: self.dir.clone(), name: name.to_string() }),
        }
    }

    /// Where a tensor is, for error messages: `dir/shard` when known, else `dir`.
    fn location(&self, name: &str) -> PathBuf {
        self.origin.get(name).map_or_else(|| self.dir.clone(), |f| self.dir.join(f))
    }

    /// Takes a tensor and checks that its element type is a float one (f32, f16, bf16).
    pub fn get_float(&mut self, name: &str) -> Result<Array> {
        let a = self.get(name)?;
        if !is_float(a.dtype()) {
            return Err(Error::WeightDtype {
                dir: self.location(name),
                name: name.to_string(),
                expected: "a float type (float32, float16 or bfloat16)".into(),
                got: a.dtype().to_string(),
            });
        }
        match self.conversion.cast {
            Some(d) if d != a.dtype() => Ok(a.astype(d)?),
            _ => Ok(a),
        }
    }

    /// Takes a float tensor (see [`WeightMap::get_float`]) and checks its shape.
    pub fn get_shaped(&mut self, name: &str, expected: &[i32]) -> Result<Array> {
        let a = self.get_float(name)?;
        let got = a.shape()?;
        if got != expected {
            return Err(Error::WeightShape {
                dir: self.dir.clone(),
                name: name.to_string(),
                expected: expected.to_vec(),
                got,
            });
        }
        Ok(a)
    }

    /// A linear (or embedding table) at module path `module` with logical shape `[out, in]`:
    /// dense if there is no `module.scales`, else quantized with the config's per-path spec or
    /// the spec inferred from shapes (mlx-lm `infer_quant_config`).
    pub fn linear(&mut self, module: &str, out: usize, inp: usize) -> Result<LinearWeights> {
        self.stacked_linear(module, None, out, inp)
    }

    /// Like [`WeightMap::linear`] for a stack of `experts` matrices `[E, out, in]` (switch layers).
    pub fn stacked_linear(
        &mut self,
        module: &str,
        experts: Option<usize>,
        out: usize,
        inp: usize,
    ) -> Result<LinearWeights> {
        let lead: Vec<i32> = experts.iter().map(|&e| e as i32).collect();
        let with_lead = |tail: &[i32]| -> Vec<i32> { lead.iter().chain(tail).copied().collect() };
        let wname = format!("{module}.weight");
        let sname = format!("{module}.scales");
        let full_path = format!("{}{module}", self.prefix);
        let override_spec = self.quantization.as_ref().and_then(|q| q.overrides.get(&full_path).copied());
        let quantized = match override_spec {
            Some(None) => false,
            Some(Some(_)) => true,
            // A packed uint32 weight is quantized even when its scales are missing.
            None => self.contains(&sname) || self.tensors.get(&wname).is_some_and(|w| w.dtype() == Dtype::U32),
        };
        if !quantized {
            let stored_bf16 = self.tensors.get(&wname).is_some_and(|w| w.dtype() == Dtype::Bf16);
            let to_f32 = self.conversion.cast == Some(Dtype::F32);
            if self.bf16_matrices && to_f32 && stored_bf16 && experts.is_none() {
                let keep = std::mem::replace(&mut self.conversion, Conversion::NONE);
                let w = self.get_shaped(&wname, &[out as i32, inp as i32]);
                self.conversion = keep;
                return Ok(LinearWeights::Bf16AsF32(w?));
            }
            return Ok(LinearWeights::Dense(self.get_shaped(&wname, &with_lead(&[out as i32, inp as i32]))?));
        }
        let bname = format!("{module}.biases");
        for part in [&sname, &bname] {
            if !self.contains(part) {
                // Named as what it is: a missing tensor, not a shape mismatch of the weight.
                let detail = format!("the tensor {part:?} is missing from the checkpoint");
                return Err(Error::Quantization { dir: self.dir.clone(), name: wname, detail });
            }
        }
        let weight = self.get(&wname)?;
        let scales = self.get_float(&sname)?;
        let biases = self.get_float(&bname)?;
        let qerr = |detail: String| Error::Quantization { dir: self.location(&wname), name: wname.clone(), detail };
        if weight.dtype() != Dtype::U32 {
            return Err(qerr(format!("packed weight has dtype {}, expected uint32", weight.dtype())));
        }
        let (full_ws, full_ss) = (weight.shape()?, scales.shape()?);
        let n = lead.len();
        let lead_ok =
            full_ws.len() == n + 2 && full_ss.len() == n + 2 && full_ws[..n] == lead[..] && full_ss[..n] == lead[..];
        let (ws, ss) = (full_ws[n.min(full_ws.len())..].to_vec(), full_ss[n.min(full_ss.len())..].to_vec());
        if !lead_ok || ws.len() != 2 || ss.len() != 2 || ws[0] != out as i32 || ss[0] != out as i32 || ss[1] <= 0 {
            return Err(qerr(format!(
                "weight {full_ws:?} / scales {full_ss:?} do not fit a {:?} matrix",
                with_lead(&[out as i32, inp as i32])
            )));
        }
        let spec = match override_spec.flatten() {
            Some(s) => s,
            None => {
                // No spec in the config: infer it from the packed widths.
                let group = inp as i32 / ss[1];
                let bits = ws[1] * 32 / inp as i32;
                mlx_core::quant::QuantSpec::new(bits.max(0) as u32, group.max(0) as u32)
                    .map_err(|e| qerr(e.to_string()))?
            }
        };
        let expect_w = (inp as u32 * spec.bits() / 32) as i32;
        let expect_s = (inp as u32 / spec.group_size()) as i32;
        if ws[1] != expect_w || ss[1] != expect_s || biases.shape()? != full_ss {
            return Err(qerr(format!(
                "weight {full_ws:?}, scales {full_ss:?}, biases {:?} do not match {} bits / group {} for in={inp} (expected weight [{out}, {expect_w}], scales [{out}, {expect_s}])",
                biases.shape()?,
                spec.bits(),
                spec.group_size()
            )));
        }
        let q = Quantized { weight, scales, biases, spec };
        let to_f32 = self.conversion.cast == Some(Dtype::F32);
        if self.packed_matrices && to_f32 && experts.is_none() && q.row_readable() {
            return Ok(LinearWeights::Quantized(q));
        }
        if self.conversion.dequantize {
            // Evaluated now so the packed tensors can be freed as loading goes on.
            let dense = q.dequantize()?;
            let dense = match self.conversion.cast {
                Some(d) if d != dense.dtype() => dense.astype(d)?,
                _ => dense,
            };
            dense.eval()?;
            return Ok(LinearWeights::Dense(dense));
        }
        Ok(LinearWeights::Quantized(q))
    }

    /// Fails if any tensor was not taken (strict load).
    pub fn finish(self) -> Result<()> {
        let unused: Vec<String> = self.tensors.keys().filter(|k| !self.taken.contains(*k)).cloned().collect();
        if unused.is_empty() {
            return Ok(());
        }
        Err(Error::UnusedWeights { dir: self.dir, count: unused.len(), first: unused.into_iter().take(5).collect() })
    }

    /// The checkpoint directory (for error messages).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_core::quant::{quantize, QuantSpec};
    use mlx_core::random::{key, normal};

    /// The GPU's row-by-row and row-block products assemble the rows in order and in the
    /// product's shape: on the CPU, whose kernels give each row the same bits in any batch, they
    /// must equal the whole product bit for bit (dense bf16 and f32, and 4-bit).
    #[test]
    fn row_by_row_equals_the_whole_product() -> Result<()> {
        let w32 = normal(&[96, 128], Dtype::F32, 0.0, 0.1, &key(1)?)?;
        let x32 = normal(&[1, 5, 128], Dtype::F32, 0.0, 1.0, &key(2)?)?;
        let cases = [
            (LinearWeights::Dense(w32.astype(Dtype::Bf16)?), x32.astype(Dtype::Bf16)?),
            (LinearWeights::Dense(w32.clone()), x32.clone()),
            (LinearWeights::Quantized(quantize(&w32, QuantSpec::new(4, 64)?)?), x32.clone()),
        ];
        for (w, x) in cases {
            let whole = w.matmul_t_whole(&x)?;
            let a = whole.astype(Dtype::F32)?.to_vec::<f32>()?;
            for split in [w.matmul_t_row_by_row(&x, 5)?, w.matmul_t_blocked(&x, 5)?] {
                assert_eq!(split.shape()?, vec![1, 5, 96]);
                assert_eq!(split.dtype(), whole.dtype());
                let b = split.astype(Dtype::F32)?.to_vec::<f32>()?;
                assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{w:?}: rows differ");
            }
        }
        Ok(())
    }
}
