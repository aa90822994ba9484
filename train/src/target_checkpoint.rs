//! What `dspark train-target` ships: the trained target as a checkpoint directory (bf16
//! weights, the BPE tokenizer, the PSF notice of the corpus, the training report), and the
//! byte-bigram baseline its bits per byte are reported against.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gemma4::checkpoint::{write_weights, StagedDir};
use gemma4::{Model, TextConfig};
use mlx_core::{Array, Dtype};
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::bpe::write_tokenizer;
use crate::error::{Error, Result};
use crate::target_train::{model_from, TargetReport};

/// The PSF notice shipped next to weights trained on the Python standard library.
pub const PSF_NOTICE: &str =
    "The weights in this directory were trained by dspark-rs on the source code of the Python\n\
standard library, Copyright (c) 2001 Python Software Foundation; All Rights Reserved,\n\
distributed under the PSF License Agreement (https://docs.python.org/3/license.html).\n";

/// Bits per byte of an add-one-smoothed byte bigram fitted on `train`, on `val`: the baseline
/// a trained model's bits per byte is reported against.
pub fn byte_bigram_bits_per_byte(train: &[&str], val: &[&str]) -> f64 {
    let mut counts = vec![[1u32; 256]; 256];
    let mut totals = vec![256u64; 256];
    for t in train {
        for w in t.as_bytes().windows(2) {
            counts[w[0] as usize][w[1] as usize] += 1;
            totals[w[0] as usize] += 1;
        }
    }
    let (mut bits, mut n) = (0f64, 0u64);
    for t in val {
        for w in t.as_bytes().windows(2) {
            let p = counts[w[0] as usize][w[1] as usize] as f64 / totals[w[0] as usize] as f64;
            bits -= p.log2();
            n += 1;
        }
    }
    bits / n.max(1) as f64
}

/// The trained parameters rounded to bf16, as the checkpoint stores them, by name.
fn shipped_weights(report: &TargetReport) -> Result<BTreeMap<String, Array>> {
    report.names.iter().zip(&report.params).map(|(n, p)| Ok((n.clone(), p.astype(Dtype::Bf16)?))).collect()
}

/// The model as shipped (bf16 weights), to show what users will see.
pub fn shipped_model(cfg: &TextConfig, report: &TargetReport) -> Result<Model> {
    let weights = shipped_weights(report)?;
    let (names, params): (Vec<String>, Vec<Array>) = weights.into_iter().unzip();
    model_from(cfg, &names, &params)
}

/// Writes the checkpoint to `out` atomically (staged, then renamed; `force` replaces an
/// existing one): `config.json` and bf16 `model.safetensors`, `tokenizer.json` and its config
/// with `chat_template`, `LICENSE-PSF.txt` and `train_report.json` (`summary`). Returns the
/// directory.
pub fn write_target_checkpoint(
    out: &Path,
    force: bool,
    cfg: &TextConfig,
    report: &TargetReport,
    (tokenizer, chat_template): (&Tokenizer, &str),
    summary: &Value,
) -> Result<PathBuf> {
    let staged = StagedDir::new(out, force)?;
    let io = |path: PathBuf| move |source| Error::Io { path, source };
    write_weights(staged.path(), cfg, &shipped_weights(report)?, 1)?;
    write_tokenizer(tokenizer, staged.path(), chat_template)?;
    let notice = staged.path().join("LICENSE-PSF.txt");
    std::fs::write(&notice, PSF_NOTICE).map_err(io(notice.clone()))?;
    let report_path = staged.path().join("train_report.json");
    let text = serde_json::to_string_pretty(summary)
        .map_err(|e| Error::Invalid { what: "train_report.json".into(), detail: e.to_string() })?;
    std::fs::write(&report_path, text).map_err(io(report_path.clone()))?;
    Ok(staged.commit()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bigram_baseline_rewards_predictable_text() {
        let train = ["abababababababab"];
        let predictable = byte_bigram_bits_per_byte(&train, &["abababab"]);
        let surprising = byte_bigram_bits_per_byte(&train, &["azqxwvut"]);
        // Add-one smoothing over 256 bytes keeps a short training text far from certainty.
        assert!(predictable < 6.0 && surprising > 7.5, "{predictable} {surprising}");
        assert_eq!(byte_bigram_bits_per_byte(&train, &[]), 0.0);
    }
}
