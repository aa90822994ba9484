//! MLX-affine quantized copies of drafter checkpoints (docs/formats.md, "Quantized drafters"),
//! in the layout mlx-lm / MLX-community use, so gemma4's `WeightMap` — the target loader's
//! quantization code — reads them back: packed `<module>.weight` (uint32) + `<module>.scales` +
//! `<module>.biases` (bf16), and a `quantization` block `{group_size, bits, mode: "affine",
//! "<module>": false, …}` where `false` marks a module kept at full precision.
//!
//! Drafter numerics move acceptance, never output (the target verifies every draft), so the
//! only quality gate is an acceptance A/B against the bf16 drafter.
//!
//! Formats:
//! - **DeepSpec** (`config.json`, HF `[out, in]` bf16): every 2-D `<module>.weight` is quantized
//!   along its last axis, including the gather tables `embed_tokens` and
//!   `markov_head.markov_w1` (read as gather-then-dequantize); `confidence_head.*` stays dense
//!   with a `"confidence_head.proj": false` entry; norms, `layer_scalar` and biases pass
//!   through. `config.json` gets the block as both `quantization` and `quantization_config`.
//! - **DSpark** (`dspark.json`, f32 `[in, out]`): each matmul parameter `P`
//!   (`bb.{i}.{q,k,v,o,gate,up,down}`, `W_c`, `tok_proj`, `out_proj`, `markov.w2`) is written
//!   as `P.weight` / `P.scales` / `P.biases` = quantize(bf16(P)ᵀ) — `[out, in]` packed, used
//!   with `quantized_matmul(transpose = true)` — and the key `P` is absent; the gather table
//!   `markov.w1` `[V, r]` is quantized as stored (rows are tokens). Norms, `mask_emb`,
//!   `block_pos`, `conf.w`, `conf.b` stay f32 under their own keys. `dspark.json` gets a
//!   `quantization` block with `"conf.w": false, "conf.b": false`.
//!
//! Refusals (each an [`Error`] variant naming the path, and the tensor where there is one): not
//! a drafter, a Gemma-4 target (use `dspark quantize-target`), already
//! quantized, bits ∉ {4, 8}, group size ∉ {32, 64, 128}, a non-empty output without `force`,
//! an output that would replace the source. A matrix whose quantized axis the group size does
//! not divide is quantized with the largest smaller group size that divides it, or kept dense
//! when none does, and the run says which (mlx-lm would keep it dense silently). Everything is checked before any data is
//! read; the output is staged in a hidden temporary sibling and renamed into place only after
//! the load smoke passes, so a failed or interrupted run leaves nothing that looks like a
//! checkpoint.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod error;
mod plan;
pub mod smoke;

use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_json, ShardWriter, StagedDir};
use mlx_core::quant::{quantize, QuantSpec};
use mlx_core::Dtype;
use serde_json::{json, Map, Value};

pub use error::{Error, Result};
pub use smoke::{Smoke, SmokeOutcome};
pub use spec_decode::loader::DrafterKind;

use error::io;
use plan::Action;

/// Bit widths the quantizer writes.
pub const BITS: [u32; 2] = [4, 8];
/// Group sizes the quantizer writes.
pub const GROUP_SIZES: [u32; 3] = [32, 64, 128];
/// Default shard size (mlx-lm's 5 GiB).
pub const DEFAULT_SHARD_BYTES: usize = 5 << 30;

/// Settings of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizeOptions {
    /// 4 or 8.
    pub bits: u32,
    /// 32, 64 or 128; a matrix it does not divide gets the largest smaller one that does (or
    /// stays dense), with a [`Progress::Warning`].
    pub group_size: u32,
    /// Replace a non-empty output directory.
    pub force: bool,
    /// How the written checkpoint is checked before it is committed.
    pub smoke: Smoke,
    /// Largest safetensors shard written.
    pub shard_bytes: usize,
}

impl Default for QuantizeOptions {
    /// 4 bits, group 64, automatic smoke.
    fn default() -> Self {
        QuantizeOptions { bits: 4, group_size: 64, force: false, smoke: Smoke::Auto, shard_bytes: DEFAULT_SHARD_BYTES }
    }
}

/// Progress events, in order: `Start`, one `Tensor` per source tensor, `Warning`s, `Smoke`.
#[derive(Clone, Debug, PartialEq)]
pub enum Progress {
    /// The source is read and planned.
    Start {
        /// The drafter's format.
        kind: DrafterKind,
        /// Source tensors.
        tensors: usize,
        /// Their total bytes.
        src_bytes: u64,
    },
    /// One source tensor written, quantized or as is.
    Tensor {
        /// 1-based position among the source tensors.
        index: usize,
        /// Source tensors.
        total: usize,
        /// The source tensor's name.
        name: String,
        /// Its source shape.
        shape: Vec<i32>,
        /// Its source dtype.
        dtype: Dtype,
        /// Written as packed weight, scales and biases.
        quantized: bool,
        /// Bytes in the source.
        src_bytes: u64,
        /// Bytes written (all three arrays when quantized).
        dst_bytes: u64,
    },
    /// A note from the plan or the smoke (a group size lowered, a matrix kept dense, …).
    Warning(String),
    /// The smoke's result.
    Smoke(SmokeOutcome),
}

/// What a run wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantReport {
    /// The drafter's format.
    pub kind: DrafterKind,
    /// Where the checkpoint was written.
    pub out_dir: PathBuf,
    /// Source tensors quantized (each written as weight + scales + biases).
    pub tensors_quantized: usize,
    /// Source tensors written unchanged.
    pub tensors_kept: usize,
    /// Tensor bytes of the source.
    pub src_bytes: u64,
    /// Tensor bytes of the output.
    pub dst_bytes: u64,
    /// Achieved bits per quantized weight, scales and biases included (4-bit, group 64: 4.5).
    pub bits_per_weight: f64,
    /// Safetensors shards written.
    pub shards: usize,
    /// What the load smoke did.
    pub smoke: SmokeOutcome,
}

/// `<src>-affine-q<bits>-g<group>`, the default output directory, beside the source.
pub fn default_out_dir(src: &Path, bits: u32, group_size: u32) -> PathBuf {
    // Beside the source (resolved first, so `--src .` does not put it inside).
    let src = src.canonicalize().unwrap_or_else(|_| src.to_path_buf());
    let name = src.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "drafter".into());
    src.with_file_name(format!("{name}-affine-q{bits}-g{group_size}"))
}

/// Writes an MLX-affine quantized copy of the drafter checkpoint `src` to `dst`.
pub fn quantize_drafter(
    src: &Path,
    dst: &Path,
    opts: &QuantizeOptions,
    progress: &mut dyn FnMut(&Progress),
) -> Result<QuantReport> {
    if !BITS.contains(&opts.bits) {
        return Err(Error::UnsupportedBits(opts.bits));
    }
    if !GROUP_SIZES.contains(&opts.group_size) {
        return Err(Error::UnsupportedGroupSize(opts.group_size));
    }
    QuantSpec::new(opts.bits, opts.group_size)?;
    let mut source = plan::open(src)?;
    let plan = plan::plan(&source, src, opts.group_size)?;
    check_output(src, dst, opts.force)?;
    let src_bytes: u64 = source.tensors.values().map(|a| a.nbytes() as u64).sum();
    progress(&Progress::Start { kind: source.kind, tensors: plan.entries.len(), src_bytes });
    for note in &plan.notes {
        progress(&Progress::Warning(note.clone()));
    }

    let staged = StagedDir::new(dst, opts.force)?;
    let mut writer = ShardWriter::new(staged.path(), opts.shard_bytes);
    let (mut quantized, mut kept, mut q_elems, mut q_bytes) = (0usize, 0usize, 0u64, 0u64);
    let total = plan.entries.len();
    for (index, (name, action)) in plan.entries.iter().enumerate() {
        // Taking the tensor out of the map drops the source handle once written.
        let Some(a) = source.tensors.remove(name) else { continue };
        let (shape, dtype, in_bytes) = (a.shape()?, a.dtype(), a.nbytes() as u64);
        let out = match action {
            Action::Quantize { module, transpose, group_size } => {
                let w = a.astype(Dtype::Bf16)?;
                let w = if *transpose { w.transpose(&[1, 0])?.contiguous()? } else { w };
                let q = quantize(&w, QuantSpec::new(opts.bits, *group_size)?)?;
                quantized += 1;
                q_elems += a.size()? as u64;
                vec![
                    (format!("{module}.weight"), q.weight),
                    (format!("{module}.scales"), q.scales),
                    (format!("{module}.biases"), q.biases),
                ]
            }
            Action::Keep => {
                kept += 1;
                vec![(name.clone(), a)]
            }
        };
        mlx_core::eval(&out.iter().map(|(_, a)| a).collect::<Vec<_>>())?;
        let out_bytes: u64 = out.iter().map(|(_, a)| a.nbytes() as u64).sum();
        let is_quantized = matches!(action, Action::Quantize { .. });
        if is_quantized {
            q_bytes += out_bytes;
        }
        writer.push(out)?;
        progress(&Progress::Tensor {
            index: index + 1,
            total,
            name: name.clone(),
            shape,
            dtype,
            quantized: is_quantized,
            src_bytes: in_bytes,
            dst_bytes: out_bytes,
        });
    }
    let (shards, dst_bytes) = writer.finish()?;
    write_config(&source, staged.path(), &quant_block(opts, &plan))?;
    copy_aux_files(src, staged.path(), source.config_file)?;

    let smoke = smoke::run(staged.path(), dst, &opts.smoke, &mut |w| progress(&Progress::Warning(w)))?;
    progress(&Progress::Smoke(smoke.clone()));
    let out_dir = staged.commit()?;
    Ok(QuantReport {
        kind: source.kind,
        out_dir,
        tensors_quantized: quantized,
        tensors_kept: kept,
        src_bytes,
        dst_bytes: dst_bytes as u64,
        bits_per_weight: if q_elems == 0 { 0.0 } else { (q_bytes * 8) as f64 / q_elems as f64 },
        shards,
        smoke,
    })
}

/// Refuses an output that would replace the source, or a non-empty one without `force`.
fn check_output(src: &Path, dst: &Path, force: bool) -> Result<()> {
    let resolve = |p: &Path| -> PathBuf {
        if let Ok(c) = p.canonicalize() {
            return c;
        }
        match (p.parent().filter(|d| !d.as_os_str().is_empty()).map(Path::canonicalize), p.file_name()) {
            (Some(Ok(parent)), Some(name)) => parent.join(name),
            _ => std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf()),
        }
    };
    let (s, d) = (resolve(src), resolve(dst));
    if s == d || s.starts_with(&d) {
        return Err(Error::OutputIsSource { src: src.to_path_buf(), dst: dst.to_path_buf() });
    }
    if dst.exists() && !force {
        let empty = std::fs::read_dir(dst).map_err(io(dst))?.next().is_none();
        if !empty {
            return Err(Error::OutputNotEmpty { path: dst.to_path_buf() });
        }
    }
    Ok(())
}

/// `{group_size, bits, mode: "affine", "<module>": false | {group_size, bits}, …}` (mlx-lm's
/// layout: unquantized modules and per-module group sizes as overrides).
fn quant_block(opts: &QuantizeOptions, plan: &plan::Plan) -> Value {
    let mut block = Map::new();
    block.insert("group_size".into(), json!(opts.group_size));
    block.insert("bits".into(), json!(opts.bits));
    block.insert("mode".into(), json!("affine"));
    for m in &plan.dense_modules {
        block.insert(m.clone(), Value::Bool(false));
    }
    for (m, g) in &plan.group_overrides {
        block.insert(m.clone(), json!({"group_size": g, "bits": opts.bits, "mode": "affine"}));
    }
    Value::Object(block)
}

/// The source config with the block added (DeepSpec: as `quantization` and
/// `quantization_config`; DSpark: as `quantization`).
fn write_config(source: &plan::Source, dir: &Path, block: &Value) -> Result<()> {
    let mut config = source.config.clone();
    if let Value::Object(map) = &mut config {
        map.insert("quantization".into(), block.clone());
        if source.kind == DrafterKind::DeepSpec {
            map.insert("quantization_config".into(), block.clone());
        }
    }
    Ok(write_json(&dir.join(source.config_file), &config)?)
}

/// Copies the other regular files (tokenizer, chat template, generation config, README, …).
fn copy_aux_files(src: &Path, dst: &Path, config_file: &str) -> Result<()> {
    for entry in std::fs::read_dir(src).map_err(io(src))? {
        let entry = entry.map_err(io(src))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let skip = name.starts_with('.')
            || name.ends_with(".safetensors")
            || name == "model.safetensors.index.json"
            || name == config_file
            || !entry.file_type().map_err(io(&entry.path()))?.is_file();
        if !skip {
            std::fs::copy(entry.path(), dst.join(&name)).map_err(io(&entry.path()))?;
        }
    }
    Ok(())
}

/// Tensor size for humans (`1.8 GiB`).
pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", units[u])
    }
}
