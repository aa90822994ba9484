//! Training data for drafters, regenerated from the target: shards of sequences (prompt +
//! the target's own response) with the target's tapped hidden rows, so the target's law p^t can
//! be recomputed through its frozen LM head instead of storing V-wide distributions.
//!
//! `shard_NNNNN/` holds `data.safetensors` — `rows` `[L, m·H]` (bf16, the taps concatenated in
//! tap order; the last tap must be the final-norm output), `ids` `[L]` u32, `seq_lens` `[n]` u32,
//! `resp_starts` `[n]` u32 (first response position of each sequence) — and `shard.json` with
//! the format version, the target's identity and the tap layers, which every reader checks.

use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_json, StagedDir};
use mlx_core::{Array, Dtype};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `shard.json`'s `format` value: marks a directory as a regenerated-data shard.
pub const SHARD_FORMAT: &str = "dspark-regen-shard";
/// The shard format version written and read.
pub const SHARD_VERSION: u32 = 1;

/// The target a shard was regenerated from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetId {
    /// The target's `hidden_size` H.
    pub hidden_size: usize,
    /// The target's vocabulary size V.
    pub vocab_size: usize,
    /// The target's decoder layer count (a tap equal to it is the final-norm output).
    pub num_layers: usize,
}

impl std::fmt::Display for TargetId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "hidden size {}, vocabulary {}, {} layers", self.hidden_size, self.vocab_size, self.num_layers)
    }
}

impl TargetId {
    /// The identity of the target with config `cfg`.
    pub fn of(cfg: &gemma4::TextConfig) -> TargetId {
        TargetId { hidden_size: cfg.hidden_size, vocab_size: cfg.vocab_size, num_layers: cfg.num_hidden_layers }
    }
}

/// `shard.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMeta {
    /// Always [`SHARD_FORMAT`].
    pub format: String,
    /// Always [`SHARD_VERSION`].
    pub version: u32,
    /// The target the shard was regenerated from.
    pub target: TargetId,
    /// Tap indices (`num_layers` = the final-norm output), in feature order.
    pub tap_layers: Vec<usize>,
    /// Sequences in the shard.
    pub n_seq: usize,
    /// Tokens in the shard, all sequences together.
    pub n_tokens: usize,
}

impl ShardMeta {
    /// The descriptor of a shard of this format version.
    pub fn new(target: &TargetId, taps: &[usize], n_seq: usize, n_tokens: usize) -> ShardMeta {
        ShardMeta {
            format: SHARD_FORMAT.into(),
            version: SHARD_VERSION,
            target: target.clone(),
            tap_layers: taps.to_vec(),
            n_seq,
            n_tokens,
        }
    }
}

/// One regenerated sequence.
#[derive(Clone, Debug)]
pub struct Sequence {
    /// Token ids, prompt then response.
    pub ids: Vec<u32>,
    /// First position of the response (anchors are drawn from the response only).
    pub resp_start: usize,
    /// Tapped rows of every position // `[L, m·H]`
    pub rows: Array,
}

/// A loaded shard.
#[derive(Clone, Debug)]
pub struct Shard {
    /// The shard's directory.
    pub path: PathBuf,
    /// Its `shard.json`.
    pub meta: ShardMeta,
    /// `[L_tot, m·H]`
    pub rows: Array,
    /// Token ids of all sequences, concatenated `[L_tot]`.
    pub ids: Vec<u32>,
    /// Start offset, length and response start of each sequence.
    pub seqs: Vec<(usize, usize, usize)>,
}

impl Shard {
    /// An in-memory shard of `seqs` (for evaluating on sequences that are never written).
    pub fn from_sequences(target: &TargetId, taps: &[usize], seqs: &[Sequence]) -> Result<Shard> {
        let rows = mlx_core::concatenate(&seqs.iter().map(|s| &s.rows).collect::<Vec<_>>(), 0)?;
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let mut at = 0;
        let spans = seqs
            .iter()
            .map(|s| {
                let span = (at, s.ids.len(), s.resp_start);
                at += s.ids.len();
                span
            })
            .collect();
        let meta = ShardMeta::new(target, taps, seqs.len(), ids.len());
        Ok(Shard { path: PathBuf::from("<in memory>"), meta, rows, ids, seqs: spans })
    }
}

/// Writes `seqs` as shard `index` under `data_dir` (atomically).
pub fn write_shard(
    data_dir: &Path,
    index: usize,
    target: &TargetId,
    taps: &[usize],
    seqs: &[Sequence],
) -> Result<PathBuf> {
    let dir = data_dir.join(format!("shard_{index:05}"));
    let staged = StagedDir::new(&dir, false)?;
    let n_tokens: usize = seqs.iter().map(|s| s.ids.len()).sum();
    let width = (taps.len() * target.hidden_size) as i32;
    for (i, s) in seqs.iter().enumerate() {
        if s.rows.shape()? != [s.ids.len() as i32, width] || s.resp_start > s.ids.len() {
            return Err(Error::Mismatch {
                what: "shard sequence",
                detail: format!(
                    "sequence {i}: {} ids, response at {}, rows {:?} (expected [{}, {width}])",
                    s.ids.len(),
                    s.resp_start,
                    s.rows.shape()?,
                    s.ids.len()
                ),
            });
        }
    }
    let rows = mlx_core::concatenate(&seqs.iter().map(|s| &s.rows).collect::<Vec<_>>(), 0)?.astype(Dtype::Bf16)?;
    let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
    let lens: Vec<u32> = seqs.iter().map(|s| s.ids.len() as u32).collect();
    let starts: Vec<u32> = seqs.iter().map(|s| s.resp_start as u32).collect();
    let (ids, lens, starts) = (
        Array::from_slice(&ids, &[ids.len() as i32])?,
        Array::from_slice(&lens, &[lens.len() as i32])?,
        Array::from_slice(&starts, &[starts.len() as i32])?,
    );
    mlx_core::save_safetensors(
        &staged.path().join("data.safetensors"),
        [("rows", &rows), ("ids", &ids), ("seq_lens", &lens), ("resp_starts", &starts)],
        &Default::default(),
    )?;
    let meta = ShardMeta::new(target, taps, seqs.len(), n_tokens);
    let v = serde_json::to_value(&meta).map_err(|e| Error::State { path: dir.clone(), detail: e.to_string() })?;
    write_json(&staged.path().join("shard.json"), &v)?;
    Ok(staged.commit()?)
}

/// Reads one shard, checking it against its own `shard.json`.
pub fn read_shard(dir: &Path) -> Result<Shard> {
    let meta = read_meta(dir)?;
    let data = dir.join("data.safetensors");
    let bad = |detail: String| Error::State { path: data.clone(), detail };
    let mut t = mlx_core::load_safetensors(&data)?.tensors;
    let mut take = |k: &str| t.remove(k).ok_or_else(|| bad(format!("tensor {k:?} is missing")));
    let (rows, ids, lens, starts) = (take("rows")?, take("ids")?, take("seq_lens")?, take("resp_starts")?);
    let ids = ids.astype(Dtype::U32)?.to_vec::<u32>()?;
    let lens = lens.astype(Dtype::U32)?.to_vec::<u32>()?;
    let starts = starts.astype(Dtype::U32)?.to_vec::<u32>()?;
    let width = (meta.tap_layers.len() * meta.target.hidden_size) as i32;
    if rows.shape()? != [ids.len() as i32, width] {
        return Err(bad(format!("rows are {:?}, expected [{}, {width}]", rows.shape()?, ids.len())));
    }
    if lens.len() != starts.len() || lens.len() != meta.n_seq || ids.len() != meta.n_tokens {
        return Err(bad(format!(
            "{} lengths, {} response starts and {} ids, but shard.json says {} sequences of {} tokens",
            lens.len(),
            starts.len(),
            ids.len(),
            meta.n_seq,
            meta.n_tokens
        )));
    }
    if lens.iter().map(|&l| l as usize).sum::<usize>() != ids.len() {
        return Err(bad("sequence lengths do not add up to the token count".into()));
    }
    if let Some(bad_id) = ids.iter().find(|&&i| i as usize >= meta.target.vocab_size) {
        return Err(bad(format!("token id {bad_id} is outside the vocabulary of {}", meta.target.vocab_size)));
    }
    let mut seqs = Vec::with_capacity(lens.len());
    let mut at = 0;
    for (i, (&l, &s)) in lens.iter().zip(&starts).enumerate() {
        if s > l {
            return Err(bad(format!("sequence {i}: response starts at {s}, past its length {l}")));
        }
        seqs.push((at, l as usize, s as usize));
        at += l as usize;
    }
    Ok(Shard { path: dir.to_path_buf(), meta, rows, ids, seqs })
}

/// Reads and checks `dir/shard.json`.
pub fn read_meta(dir: &Path) -> Result<ShardMeta> {
    let path = dir.join("shard.json");
    let text = mlx_core::files::read_text(&path, mlx_core::files::JSON_LIMIT)
        .map_err(|source| Error::Io { path: path.clone(), source })?;
    let meta: ShardMeta =
        serde_json::from_str(&text).map_err(|e| Error::State { path: path.clone(), detail: e.to_string() })?;
    if meta.format != SHARD_FORMAT || meta.version != SHARD_VERSION {
        return Err(Error::State {
            path,
            detail: format!(
                "format {:?} version {}, expected {SHARD_FORMAT:?} version {SHARD_VERSION}",
                meta.format, meta.version
            ),
        });
    }
    Ok(meta)
}

/// The shard directories under `data_dir`, sorted, all of one target and tap set (checked
/// against `expect` when given).
pub fn list_shards(data_dir: &Path, expect: Option<(&TargetId, &[usize])>) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(data_dir).map_err(|source| Error::Io { path: data_dir.into(), source })?;
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("shard_")))
        .collect();
    dirs.sort();
    let mut first: Option<ShardMeta> = None;
    for d in &dirs {
        let m = read_meta(d)?;
        let (target, taps) = match (&first, expect) {
            (_, Some((t, taps))) => (t.clone(), taps.to_vec()),
            (Some(f), None) => (f.target.clone(), f.tap_layers.clone()),
            (None, None) => (m.target.clone(), m.tap_layers.clone()),
        };
        if m.target != target || m.tap_layers != taps {
            return Err(Error::State {
                path: d.join("shard.json"),
                detail: format!(
                    "regenerated from a target of {} with taps {:?}, expected a target of {target} with taps {taps:?}",
                    m.target, m.tap_layers
                ),
            });
        }
        first.get_or_insert(m);
    }
    Ok(dirs)
}
